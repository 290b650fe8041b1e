package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
)

// A reply meant for an earlier conversation (one that timed out while QEMU
// was busy, answered only after the next client connected) does not answer
// this client's commands: each is matched to its reply by id.
func TestQMPSkipsAnEarlierConversationsReply(t *testing.T) {
	dir, ln := fakeMonitor(t)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		rd := greetQMP(c)
		// The earlier client's query-status, answered late.
		_, _ = fmt.Fprintln(c, `{"return": {"status": "inmigrate", "running": false}, "id": "kairon-0"}`)
		for {
			line, err := rd.ReadBytes('\n')
			if err != nil {
				return
			}
			var req struct {
				Execute string `json:"execute"`
				ID      string `json:"id"`
			}
			if json.Unmarshal(line, &req) != nil {
				return
			}
			reply := `{}`
			if req.Execute == "query-status" {
				reply = `{"status": "running", "running": true}`
			}
			_, _ = fmt.Fprintf(c, `{"return": %s, "id": %q}`+"\n", reply, req.ID)
		}
	}()

	q, err := dialQMP(context.Background(), filepath.Join(dir, qmpSock))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	st, err := q.status()
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != "running" || !st.Running {
		t.Errorf("query-status answered %+v, want the answer to this client's own question (running)", st)
	}
}

package ui_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/ui"
)

// syncBuffer is a bytes.Buffer safe to read while Main writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMainCommand runs the command as kairon-ui runs it: --kubeconfig and
// --listen, the URL printed, the API answering, and a prompt stop (with an
// event stream still open) when its context ends.
func TestMainCommand(t *testing.T) {
	env := testenv.Get(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- ui.Main(ctx, []string{"--kubeconfig", env.Kubeconfig, "--listen", "127.0.0.1:0"}, &stdout, &stderr)
	}()
	var url string
	testenv.Eventually(t, time.Minute, "kairon-ui to print its URL", func() (bool, string) {
		select {
		case code := <-done:
			t.Fatalf("kairon-ui exited %d: %s", code, stderr.String())
		default:
		}
		out := stdout.String()
		_, rest, ok := strings.Cut(out, "kairon-ui: serving ")
		if !ok {
			return false, out
		}
		url, _, _ = strings.Cut(rest, " ")
		return true, out
	})
	var nodes ui.List[ui.Node]
	getJSON(t, url+"/api/v1/nodes", http.StatusOK, &nodes)
	stream, err := http.Get(url + "/api/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("kairon-ui exited %d: %s", code, stderr.String())
		}
	case <-time.After(4 * time.Second):
		t.Fatal("kairon-ui did not stop within 4 s of its context ending with an event stream open")
	}
	if stderr.String() != "" {
		t.Errorf("stderr: %s", stderr.String())
	}

	// With the kubeconfig's identity, a non-loopback address needs
	// --allow-non-loopback: whoever reached it would act as that identity.
	var refused syncBuffer
	if code := ui.Main(context.Background(), []string{"--kubeconfig", env.Kubeconfig, "--listen", "0.0.0.0:0"}, &refused, &refused); code != 2 || !strings.Contains(refused.String(), "--allow-non-loopback") {
		t.Errorf("--listen 0.0.0.0:0 with the kubeconfig's identity: exit %d, printed %s", code, refused.String())
	}

	var usage syncBuffer
	if code := ui.Main(context.Background(), []string{"--nope"}, &usage, &usage); code != 2 || !strings.Contains(usage.String(), "--listen") && !strings.Contains(usage.String(), "-listen") {
		t.Errorf("a bad flag: exit %d, printed %s", code, usage.String())
	}
}

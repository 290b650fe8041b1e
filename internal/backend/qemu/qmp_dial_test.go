package qemu

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestDialQMPWaitsForAFullBacklog: QEMU's monitor listens with a backlog of
// one and serves one client at a time; a connect while another client holds
// it fails with EAGAIN, and dialQMP must try again rather than fail a save.
func TestDialQMPWaitsForAFullBacklog(t *testing.T) {
	path := filepath.Join(shortTempDir(t), qmpSock)
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil { // as QEMU's: no room
		t.Fatal(err)
	}
	ln, err := net.FileListener(os.NewFile(uintptr(fd), "qmp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	// Another client fills the backlog before anyone accepts.
	var fills []net.Conn
	for range 4 {
		c, err := net.Dial("unix", path)
		if err != nil {
			break
		}
		fills = append(fills, c)
	}
	if _, err := net.Dial("unix", path); err == nil {
		t.Skip("the kernel accepted more connections than the backlog; nothing to test")
	}
	dialed := make(chan error, 1)
	go func() {
		q, err := dialQMP(context.Background(), path)
		if err == nil {
			q.Close()
		}
		dialed <- err
	}()
	// The monitor stays busy for a while: an early answer is a dial that
	// gave up on the full backlog. (The wait only decides when to make
	// room; a dial made later, on a loaded machine, passes either way.)
	select {
	case err := <-dialed:
		t.Fatalf("dialQMP returned while the monitor was busy: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	// Serve the monitor: each client its greeting and capabilities, one
	// at a time, the early ones first and hung up.
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
			if _, err := bufio.NewReader(c).ReadBytes('\n'); err == nil {
				_, _ = c.Write([]byte(`{"return": {}}` + "\n"))
			}
			c.Close()
		}
	}()
	for _, c := range fills {
		c.Close()
	}
	select {
	case err := <-dialed:
		if err != nil {
			t.Fatalf("dialQMP with the backlog full at first: %v", err)
		}
	case <-time.After(time.Duration(qmpTimeout.Load()) + 5*time.Second):
		t.Fatal("dialQMP did not return")
	}
}

// A monitor that answers qmp_capabilities with "already complete" is in
// command mode, which is all the negotiation was for: dialQMP goes on, and
// the connection takes commands. Any other refusal still fails the dial.
func TestDialQMPTakesAMonitorAlreadyInCommandMode(t *testing.T) {
	for _, tt := range []struct {
		name, answer string
		wantErr      bool
	}{
		{"already negotiated", `{"error": {"class": "CommandNotFound", "desc": "Capabilities negotiation is already complete, command ignored"}}`, false},
		{"refused", `{"error": {"class": "GenericError", "desc": "no"}}`, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir, ln := fakeMonitor(t)
			path := filepath.Join(dir, qmpSock)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				rd := greetQMP(c)
				if _, err := rd.ReadBytes('\n'); err != nil {
					return
				}
				_, _ = c.Write([]byte(tt.answer + "\n"))
				if _, err := rd.ReadBytes('\n'); err != nil {
					return
				}
				_, _ = c.Write([]byte(`{"return": {"status": "running", "running": true}}` + "\n"))
			}()
			q, err := dialQMP(context.Background(), path)
			if tt.wantErr {
				if err == nil {
					q.Close()
					t.Fatal("dialQMP took a monitor that refused qmp_capabilities")
				}
				return
			}
			if err != nil {
				t.Fatalf("dialQMP: %v", err)
			}
			defer q.Close()
			st, err := q.status()
			if err != nil || !st.Running {
				t.Fatalf("query-status after the dial: %+v, %v", st, err)
			}
		})
	}
}

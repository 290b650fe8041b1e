package client

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zyvor/kairon/internal/guestagent/agent"
)

// Dial reaches an agent whose socket path is longer than a unix socket
// address holds (a VM with a long namespace and name under a long state
// directory), and pings it.
func TestDialLongPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agent.sock")
	if len(path) <= 108 {
		t.Fatalf("path %q is not past sun_path", path)
	}
	// Listen through the directory too: bind has the same limit.
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/agent.sock", d.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	served := make(chan error, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			served <- err
			return
		}
		defer conn.Close()
		served <- agent.New(agent.Options{Boot: "b00t"}).Serve(conn)
	}()
	c, err := Dial(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(context.Background())
	if err != nil || st.Boot != "b00t" {
		t.Errorf("status over a long path: %+v %v", st, err)
	}
	c.Close()
	<-served
}

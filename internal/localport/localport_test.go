package localport

import (
	"net"
	"strconv"
	"testing"
)

// Free gives ports below the ephemeral range, free, and never one it was
// told to avoid; the port can then be listened on.
func TestFreeIsBelowTheEphemeralRangeAndFree(t *testing.T) {
	low, ok := ephemeralStart()
	if !ok {
		t.Skipf("no %s here", rangeFile)
	}
	var avoid []int
	for range 20 {
		port, err := Free(avoid)
		if err != nil {
			t.Fatal(err)
		}
		if low > lowest+100 && (port < lowest || port >= low) {
			t.Errorf("port %d is not in [%d, %d), below the ephemeral range", port, lowest, low)
		}
		for _, a := range avoid {
			if port == a {
				t.Errorf("port %d was to be avoided", port)
			}
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("listening on the free port %d: %v", port, err)
		}
		l.Close()
		avoid = append(avoid, port)
	}
	addr, err := FreeAddress()
	if err != nil {
		t.Fatal(err)
	}
	if host, _, err := net.SplitHostPort(addr); err != nil || host != "127.0.0.1" {
		t.Errorf("FreeAddress() = %q, want 127.0.0.1:PORT", addr)
	}
}

package netlab

import (
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// The thread In ran fn on is back in the test's namespace when In returns,
// and still alive: a thread that ended would kill the processes started
// from it with Pdeathsig (the e2e tests' kairon-node agents).
func TestInReturnsItsThreadToTheTestsNamespace(t *testing.T) {
	ns := Namespace(t, "kairon-in")
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		var tid int
		var inside string
		if err := In(ns, func() error {
			tid = unix.Gettid()
			inside, err = os.Readlink("/proc/thread-self/ns/net")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if inside == own {
			t.Fatalf("fn ran in the test's namespace %s, not in %s", own, ns)
		}
		after, err := os.Readlink("/proc/self/task/" + strconv.Itoa(tid) + "/ns/net")
		if err != nil {
			t.Fatalf("thread %d that ran fn is gone: %v", tid, err)
		}
		if after != own {
			t.Fatalf("thread %d that ran fn is still in %s, want the test's %s", tid, after, own)
		}
	}
}

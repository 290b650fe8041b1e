package requeue

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every manager Kairon's programs build takes ControllerConfig: a manager
// left on controller-runtime's default would starve objects after a
// restart under load, and no test of its own would show it.
func TestEveryManagerTakesTheControllerConfig(t *testing.T) {
	managers := 0
	for _, root := range []string{"../../cmd", "../../internal"} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if !strings.Contains(string(src), "ctrl.NewManager(") && !strings.Contains(string(src), "manager.New(") {
				return nil
			}
			managers++
			if !strings.Contains(string(src), "requeue.ControllerConfig()") {
				t.Errorf("%s builds a manager without requeue.ControllerConfig()", path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if managers < 2 {
		t.Errorf("found %d files building a manager, want kairon-controller's and kairon-node's at least: is the search still looking in the right place?", managers)
	}
}

// Every controller Kairon's programs build takes its queue from NewQueue
// (through Options, or NewQueue itself where it builds its own queue): one
// left on controller-runtime's default would go on running its queued
// reconciles after the stop.
func TestEveryControllerTakesTheQueue(t *testing.T) {
	builds := regexp.MustCompile(`ControllerManagedBy\(|controller\.New(Typed)?(Unmanaged)?(\[[^\]]*\])?\(`)
	queued := regexp.MustCompile(`requeue\.Options\(|requeue\.NewQueue\(`)
	controllers := 0
	for _, root := range []string{"../../cmd", "../../internal"} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			built, took := len(builds.FindAll(src, -1)), len(queued.FindAll(src, -1))
			controllers += built
			if took < built {
				t.Errorf("%s builds %d controllers and gives %d of them requeue's queue", path, built, took)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if controllers < 20 {
		t.Errorf("found %d controllers, want the 22 or so of kairon-controller and kairon-node: is the search still looking in the right place?", controllers)
	}
}

package requeue

import (
	"os"
	"path/filepath"
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

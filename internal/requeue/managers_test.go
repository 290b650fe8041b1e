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
	eachProgramSource(t, func(path, src string) {
		if !strings.Contains(src, "ctrl.NewManager(") && !strings.Contains(src, "manager.New(") {
			return
		}
		managers++
		if !strings.Contains(src, "requeue.ControllerConfig()") {
			t.Errorf("%s builds a manager without requeue.ControllerConfig()", path)
		}
	})
	if managers < 2 {
		t.Errorf("found %d files building a manager, want kairon-controller's and kairon-node's at least: is the search still looking in the right place?", managers)
	}
}

// Every controller Kairon's programs build runs its reconciler through
// UntilStopped: one that did not would run its queued reconciles after
// the stop.
func TestEveryControllerStopsWithItsManager(t *testing.T) {
	builds := regexp.MustCompile(`ControllerManagedBy\(|controller\.New(Typed)?(Unmanaged)?(\[[^\]]*\])?\(`)
	guarded := regexp.MustCompile(`requeue\.UntilStopped(Typed)?(\[[^\]]*\])?\(`)
	controllers := 0
	eachProgramSource(t, func(path, src string) {
		built, took := len(builds.FindAllString(src, -1)), len(guarded.FindAllString(src, -1))
		controllers += built
		if took < built {
			t.Errorf("%s builds %d controllers and runs %d reconcilers through requeue.UntilStopped", path, built, took)
		}
	})
	if controllers < 20 {
		t.Errorf("found %d controllers, want the 22 or so of kairon-controller and kairon-node: is the search still looking in the right place?", controllers)
	}
}

// eachProgramSource calls visit with each Go source file, tests left out,
// of Kairon's programs and the packages they build on.
func eachProgramSource(t *testing.T, visit func(path, src string)) {
	t.Helper()
	for _, root := range []string{"../../cmd", "../../internal"} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && path == filepath.Join("..", "..", "internal", "testenv") {
				// The tests' harness: no program builds on it (its
				// managers run tests' controllers, whose own files are
				// tests), and requeue's tests import it.
				return filepath.SkipDir
			}
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			visit(path, string(src))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

package host

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/zyvor/kairon/internal/controlplane"
)

// BinDirEnv overrides where the control-plane binaries are looked up.
const BinDirEnv = "KAIRON_BIN_DIR"

// BinDir returns the directory with the pinned binaries, failing t with
// what to do when they are not there. It needs no running control plane.
func BinDir(t testing.TB) string {
	t.Helper()
	SkipIfShort(t, "the pinned binaries in bin/")
	dir, err := LocateBinDir()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return dir
}

// SkipIfShort skips t under `go test -short` (make test-unit), which runs
// only the tests that need no root, no QEMU, no guest image and no control
// plane; needs says what t would have needed.
func SkipIfShort(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s: run by make test, skipped by make test-unit (-short)", needs)
	}
}

// LocateBinDir finds the pinned binaries: $KAIRON_BIN_DIR if set, else bin/
// at the root of the Kairon module above the working directory. It checks
// the binaries the control plane runs, since a half-built bin/ would
// otherwise fail later and less clearly.
func LocateBinDir() (string, error) {
	dir := os.Getenv(BinDirEnv)
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "bin")
	}
	var missing []string
	for _, name := range []string{controlplane.Etcd, controlplane.KubeAPIServer, controlplane.KubeControllerManager, "kubectl"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.IsDir() {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("%s not found in %s: run `make tools`", strings.Join(missing, ", "), dir)
	}
	return dir, nil
}

const modulePath = "github.com/zyvor/kairon"

func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if isKaironModule(filepath.Join(dir, "go.mod")) {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", errors.New("no Kairon checkout (go.mod of " + modulePath + ") above " + wd + ": set " + BinDirEnv)
		}
	}
}

// isKaironModule is exact about the module path because hack/tools has a
// go.mod of its own inside the checkout.
func isKaironModule(goMod string) bool {
	data, err := os.ReadFile(goMod)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module"); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`) == modulePath
		}
	}
	return false
}

// Process is a running process found by Processes.
type Process struct {
	PID     int
	Cmdline string // arguments joined by spaces
}

// Processes lists the running processes whose command line contains substr,
// such as a data dir: the way to check that a stop left no child behind.
func Processes(substr string) ([]Process, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var found []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue // exited meanwhile, or a kernel thread
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && isZombie(string(stat)) {
			continue // already dead, merely not reaped by its parent yet
		}
		cmdline := strings.TrimSpace(strings.ReplaceAll(string(raw), "\x00", " "))
		if strings.Contains(cmdline, substr) {
			found = append(found, Process{PID: pid, Cmdline: cmdline})
		}
	}
	return found, nil
}

// isZombie reads the state field of /proc/<pid>/stat, which follows the
// parenthesised command name (itself possibly containing spaces or ')').
func isZombie(stat string) bool {
	i := strings.LastIndexByte(stat, ')')
	return i >= 0 && len(stat) > i+2 && stat[i+2] == 'Z'
}

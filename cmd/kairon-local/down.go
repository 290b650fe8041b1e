package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

type downFlags struct {
	dataDir string
	purge   bool
	timeout time.Duration
}

func down(args []string, stdout, stderr io.Writer) int {
	var f downFlags
	fs := flag.NewFlagSet("kairon-local down", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.dataDir, "data-dir", ".kairon", "the data dir whose kairon-local and VMs to stop")
	fs.BoolVar(&f.purge, "purge", false, "then remove its QEMU nodes' guest network (bridge, taps, nftables tables) and delete the data dir: every object, certificate, log and saved VM")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "how long the running kairon-local may take to save its VMs and stop")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: kairon-local down [flags]

Stops the kairon-local running on the data dir (as Ctrl-C would: its VMs are
saved and resume at the next 'up'), then any VM still running from that data
dir, such as those a killed kairon-local left behind. With --purge it then
removes the guest network of its QEMU nodes (unless another kairon-local's
agents or VMs use it) and deletes the data dir.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kairon-local down: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := runDown(f, stdout); err != nil {
		fmt.Fprintf(stderr, "kairon-local: down: %v\n", err)
		return 1
	}
	return 0
}

// dataDirMarkers are files every data dir `up` ever used has; --purge
// deletes only a directory with one of them.
var dataDirMarkers = []string{"lock", "config.json"}

func looksLikeDataDir(dir string) bool {
	for _, m := range dataDirMarkers {
		if _, err := os.Stat(filepath.Join(dir, m)); err == nil {
			return true
		}
	}
	return false
}

func runDown(f downFlags, out io.Writer) error {
	dataDir, err := filepath.Abs(f.dataDir)
	if err != nil {
		return err
	}
	exists := dirExists(dataDir)
	if f.purge && exists && !looksLikeDataDir(dataDir) {
		return fmt.Errorf("%s is not a kairon-local data dir (it has no %s): not deleting it", dataDir, strings.Join(dataDirMarkers, " or "))
	}
	stopped := false

	// The kairon-local itself: it saves its VMs and stops its processes.
	pid, err := runningUp(dataDir)
	if errors.Is(err, errNotKaironLocal) {
		return fmt.Errorf("%w; not stopping it", err)
	}
	if err != nil {
		return err
	}
	if pid != 0 {
		fmt.Fprintf(out, "kairon-local: stopping kairon-local (pid %d) on %s; its node agents save the VMs first ...\n", pid, dataDir)
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("stopping kairon-local (pid %d): %w", pid, err)
		}
		if !waitGone(pid, f.timeout) {
			return fmt.Errorf("kairon-local (pid %d) still runs %s after SIGTERM; see %s. `kill -9 %d` ends it at once, leaving its VMs running; then run `kairon-local down` again to stop them",
				pid, f.timeout, filepath.Join(dataDir, "logs"), pid)
		}
		fmt.Fprintf(out, "kairon-local: kairon-local (pid %d) stopped\n", pid)
		stopped = true
	}

	// What a killed kairon-local can leave: its agents and control plane
	// die with it, but belt and braces.
	for _, p := range leftovers(dataDir) {
		fmt.Fprintf(out, "kairon-local: stopping %s (pid %d), left running by an earlier kairon-local\n", filepath.Base(p.argv[0]), p.pid)
		if err := terminate(p.pid, 10*time.Second); err != nil {
			return err
		}
		stopped = true
	}

	// VMs: re-adoptable leftovers of a killed kairon-local, VMs whose save
	// failed, or orphans of a deleted data dir at this path.
	vms, err := findVMs()
	if err != nil {
		return err
	}
	for _, vm := range vmsOf(vms, dataDir) {
		fate := "its guest's memory is lost, and the Machine is reported Failed at the next up"
		if vm.Deleted {
			fate = "its data dir was deleted"
		} else if savedForResume(vm) {
			fate = "it was saved and resumes at the next up"
		}
		fmt.Fprintf(out, "kairon-local: stopping VM %s (pid %d) in %s: %s\n", vm.Name, vm.PID, vm.Dir, fate)
		if err := terminate(vm.PID, 5*time.Second); err != nil {
			return err
		}
		stopped = true
	}

	if f.purge {
		if !exists {
			fmt.Fprintf(out, "kairon-local: %s does not exist; nothing to delete\n", dataDir)
			return nil
		}
		// Only once nothing runs from it any more.
		if pid, err := runningUp(dataDir); err != nil || pid != 0 {
			return fmt.Errorf("a kairon-local started on %s meanwhile (pid %d, %v): not deleting it", dataDir, pid, err)
		}
		if vms, err := findVMs(); err != nil || len(vmsOf(vms, dataDir)) > 0 {
			return fmt.Errorf("VMs still run from %s (%v): not deleting it", dataDir, err)
		}
		// Before the data dir, which records where the network is: a
		// failure here leaves both, for another try.
		if err := purgeGuestNetwork(dataDir, out); err != nil {
			return fmt.Errorf("%w; not deleting %s", err, dataDir)
		}
		if err := os.RemoveAll(dataDir); err != nil {
			return fmt.Errorf("deleting %s: %w", dataDir, err)
		}
		fmt.Fprintf(out, "kairon-local: deleted %s\n", dataDir)
		return nil
	}
	if !stopped {
		fmt.Fprintf(out, "kairon-local: nothing runs on %s\n", dataDir)
	}
	return nil
}

// savedForResume says whether the VM's agent recorded it as saved
// (internal/node/suspend.go): killing it then loses nothing.
func savedForResume(vm vmProcess) bool {
	instances := filepath.Dir(vm.Dir)
	record := filepath.Join(filepath.Dir(instances), "suspended", filepath.Base(vm.Dir)+".json")
	data, err := os.ReadFile(record)
	if err != nil {
		return false
	}
	var rec struct {
		State string `json:"state"`
	}
	return json.Unmarshal(data, &rec) == nil && rec.State == "saved"
}

// terminate sends SIGTERM, and SIGKILL if pid is still there after grace.
func terminate(pid int, grace time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return fmt.Errorf("stopping pid %d: %w", pid, err)
	}
	if waitGone(pid, grace) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing pid %d: %w", pid, err)
	}
	if !waitGone(pid, 10*time.Second) {
		return fmt.Errorf("pid %d is still there 10s after SIGKILL", pid)
	}
	return nil
}

// kaironBinaries are what `up` runs besides the VMs.
var kaironBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kairon-controller", "kairon-node", "kairon-ui"}

type leftover struct {
	pid  int
	argv []string
}

// isLeftover says whether argv is one of up's processes for dataDir: one
// of its binaries with a path in the data dir among its arguments.
func isLeftover(argv []string, dataDir string) bool {
	if len(argv) == 0 || !slices.Contains(kaironBinaries, filepath.Base(argv[0])) {
		return false
	}
	for _, a := range argv[1:] {
		_, value, ok := strings.Cut(a, "=")
		if !ok {
			value = a
		}
		for _, v := range strings.Split(value, ",") {
			if v == dataDir || strings.HasPrefix(v, dataDir+"/") {
				return true
			}
		}
	}
	return false
}

// leftovers lists up's processes for dataDir still running.
func leftovers(dataDir string) []leftover {
	var found []leftover
	_ = eachProcess(func(pid int, argv []string) bool {
		if isLeftover(argv, dataDir) {
			found = append(found, leftover{pid: pid, argv: argv})
		}
		return false
	})
	return found
}

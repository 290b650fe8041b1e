package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

var stepOutput = regexp.MustCompile(`step:(\d+)\.`)

// setStep writes n to the guest's /tmp/step, a counter the test moves by
// hand, so its value at the snapshot is known exactly.
func setStep(t *testing.T, con *testenv.Console, n int) {
	t.Helper()
	con.Expect(t, fmt.Sprintf("echo %d > /tmp/step.new; mv /tmp/step.new /tmp/step; echo set:$((%d+1)).", n, n),
		regexp.MustCompile(fmt.Sprintf(`set:%d\.`, n+1)), 30*time.Second)
}

// applyDueSchedule applies a SnapshotSchedule in namespace default that
// takes one snapshot of each Machine selector matches now, and no more: a
// yearly schedule whose status says it last ran over a year ago, so this
// year's slot, missed, is due at once (the controller takes a missed slot
// as it takes one whose time has come) and the next is months away. An
// every-minute schedule waited for the next minute, 30 s on average, and
// could fire again before the test suspended it.
func (c *localCluster) applyDueSchedule(name, selector string, retention int) {
	t := c.t
	t.Helper()
	schedule := fmt.Sprintf(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: SnapshotSchedule
metadata: {name: %s, namespace: default}
spec: {selector: %s, schedule: "@yearly", retention: %d}
`, name, selector, retention)
	// Applied until the API server takes it: once, on a loaded machine,
	// kubectl's first apply of the new kind failed.
	testenv.Eventually(t, time.Minute, "the SnapshotSchedule applied", func() (bool, string) {
		cmd := exec.Command(filepath.Join(c.binDir, "kubectl"), "--kubeconfig", c.kubeconfig, "apply", "-f", "-")
		cmd.Stdin = strings.NewReader(schedule)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("kubectl apply of the SnapshotSchedule: %v: %s", err, out)
		}
		return err == nil, fmt.Sprintf("%v: %s", err, out)
	})
	lastRun := time.Now().AddDate(-1, 0, -1).UTC().Format(time.RFC3339)
	c.kubectl("", "patch", "snapshotschedule", name, "-n", "default", "--subresource=status", "--type=merge",
		"-p", fmt.Sprintf(`{"status":{"lastScheduleTime":%q}}`, lastRun))
}

func readStep(t *testing.T, con *testenv.Console) int {
	t.Helper()
	n, _ := strconv.Atoi(con.Expect(t, "echo step:$(cat /tmp/step).", stepOutput, 30*time.Second)[1])
	return n
}

// The promise for MachineSnapshots on real QEMU: a SnapshotSchedule
// snapshots a running guest (paused only for the save, and running on
// after it), the snapshot lands on kairon-local's shared store, and
// `kaironctl restore` brings it back as a new Machine on the other node
// with the guest's memory as of the snapshot: the hand-moved counter at
// its snapshot value (the original has moved on since), the token, a
// background counter still counting, and the new Machine's own address
// and host name.
func snapshotScheduleAndRestoreOnAnotherNode(t *testing.T, c *localCluster) {
	c.kubectl(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: Machine
metadata: {name: origin, namespace: default, labels: {backup: nightly}}
spec: {nodeSelector: {kubernetes.io/hostname: node-1}}
`, "apply", "-f", "-")
	testenv.Eventually(t, 3*time.Minute, "machine origin Running on node-1", func() (bool, string) {
		state := c.jsonpath("machine", "origin", "{.status.phase} {.spec.nodeName}")
		c.stopIfFailed("origin", state)
		return state == "Running node-1", state
	})
	con := c.console("node-1", "default", "origin")
	before := startGuestState(t, con)
	setStep(t, con, 3)

	c.applyDueSchedule("nightly", "{backup: nightly}", 1)
	var snap string
	testenv.Eventually(t, 3*time.Minute, "a Ready MachineSnapshot of origin from schedule nightly", func() (bool, string) {
		out := c.listJSONPath("machinesnapshots", kaironv1.LabelSnapshotSchedule+"=nightly",
			`{range .items[*]}{.metadata.name} {.status.phase} {.status.message}{"\n"}{end}`)
		for _, line := range strings.Split(out, "\n") {
			fields := strings.Fields(line)
			if len(fields) >= 2 && fields[1] == "Ready" {
				snap = fields[0]
				return true, line
			}
		}
		return false, out
	})
	// Suspended right away, as a schedule is that must take no more.
	c.kubectl("", "patch", "snapshotschedule", "nightly", "-n", "default", "--type=merge", "-p", `{"spec":{"suspend":true}}`)
	// After the snapshot the original moves on.
	setStep(t, con, 7)
	if got := readStep(t, con); got != 7 {
		t.Fatalf("origin's step reads %d after setting 7", got)
	}
	checkGuestKeptState(t, con, before, "origin after its snapshot (the guest runs on)")

	status := c.jsonpath("machinesnapshot", snap, "{.status.node} {.status.store} {.status.sizeBytes} {.status.pauseMillis} {.status.takenAt}")
	t.Logf("machinesnapshot %s: node, store, size, pause, taken: %s", snap, status)
	fields := strings.Fields(status)
	if len(fields) != 5 || fields[0] != "node-1" || fields[1] != "kairon-local" {
		t.Fatalf("machinesnapshot %s status %q: want taken by node-1 into store kairon-local", snap, status)
	}
	if size, _ := strconv.ParseInt(fields[2], 10, 64); size < 1<<20 {
		t.Errorf("sizeBytes %s: the guest's memory is not in it", fields[2])
	}
	if pause, _ := strconv.ParseInt(fields[3], 10, 64); pause <= 0 || pause > 60_000 {
		t.Errorf("pauseMillis %s: want the save's pause, above 0 and under a minute", fields[3])
	}
	files, _ := filepath.Glob(filepath.Join(c.dataDir, "snapshots", "*.state"))
	if len(files) != 1 {
		t.Errorf("state files on the shared store: %v, want one", files)
	}
	if taken := c.machineEvents("origin", kaironv1.SnapshotReasonTaken); len(taken) == 0 {
		t.Errorf("no %s event on Machine origin", kaironv1.SnapshotReasonTaken)
	}

	out, err := exec.Command(filepath.Join(c.binDir, "kaironctl"), "--kubeconfig", c.kubeconfig, "-n", "default",
		"restore", snap, "--name", "restored").CombinedOutput()
	if err != nil {
		t.Fatalf("kaironctl restore: %v\n%s", err, out)
	}
	if want := "machine/restored created from machinesnapshot/" + snap + " (taken "; !strings.HasPrefix(string(out), want) || !strings.Contains(string(out), " on node-1)") {
		t.Errorf("kaironctl restore printed %q, want %q... on node-1)", out, want)
	}
	testenv.Eventually(t, 3*time.Minute, "machine restored Running", func() (bool, string) {
		state := c.jsonpath("machine", "restored", "{.status.phase} {.spec.nodeName} {.status.message}")
		c.stopIfFailed("restored", state)
		return strings.HasPrefix(state, "Running "), state
	})
	if node := c.jsonpath("machine", "restored", "{.spec.nodeName}"); node != "node-2" {
		// node-1 runs origin; the emptier node-2 reaches the same store.
		t.Errorf("restored on %s, want node-2", node)
	}
	if restoredEvents := c.machineEvents("restored", kaironv1.MachineReasonRestored); len(restoredEvents) != 1 {
		t.Errorf("%s events on restored: %q, want one", kaironv1.MachineReasonRestored, restoredEvents)
	}
	originIP := c.jsonpath("machine", "origin", "{.status.addresses[0].address}")
	restoredIP := c.jsonpath("machine", "restored", "{.status.addresses[0].address}")
	if restoredIP == "" || restoredIP == originIP {
		t.Errorf("restored has address %q, origin %q: want an address of its own", restoredIP, originIP)
	}

	rcon := c.console("node-2", "default", "restored")
	if got := readStep(t, rcon); got != 3 {
		t.Errorf("restored guest's step is %d, want 3, its value when the snapshot was taken (origin is at 7 now)", got)
	}
	checkGuestKeptState(t, rcon, before, "the restored guest")
	host := rcon.Expect(t, "echo host:$(hostname)-$((1+1)).", regexp.MustCompile(`host:([a-z0-9-]+)-2\.`), 30*time.Second)[1]
	if !strings.Contains(host, "restored") {
		t.Errorf("restored guest's hostname %q, want the new Machine's", host)
	}
	if page, err := getInNetNS(c.netNS, "http://"+restoredIP+":8080/"); err != nil || page == "" {
		t.Errorf("restored guest at %s did not answer: %v", restoredIP, err)
	}
	// The original is untouched by the restore.
	if got := readStep(t, con); got != 7 {
		t.Errorf("origin's step is %d after the restore, want 7", got)
	}

	// Deleting the snapshot deletes its file from the store.
	c.kubectl("", "delete", "machinesnapshot", snap, "-n", "default")
	testenv.Eventually(t, 2*time.Minute, "the state file gone from the shared store", func() (bool, string) {
		files, _ := filepath.Glob(filepath.Join(c.dataDir, "snapshots", "*"))
		return len(files) == 0, fmt.Sprint(files)
	})
	c.kubectl("", "delete", "machine", "origin", "restored", "-n", "default", "--timeout=90s")
	if vms := vmProcesses(t, c.dataDir); len(vms) != 0 {
		t.Errorf("VMs left after delete: %v", vms)
	}
}

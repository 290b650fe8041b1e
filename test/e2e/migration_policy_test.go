package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/testenv"
)

// migrationPolicyCancelsALiveMigration: on kairon-local with two QEMU
// nodes, a MigrationPolicy that caps a guest's live migration at 1 MiB/s
// with 12 s per GiB to complete (3 s for its 256Mi) makes kairon-controller
// record the policy on the migration and the source agent cancel it: the
// migration fails CompletionTimeout and the guest runs on at its node with
// its memory (token, counter going on). With a progress timeout instead, a
// target whose agent hangs mid-stream gets the migration cancelled
// NoProgress, the guest again running on at its node. Once the policy is
// gone, the same guest moves live with none recorded.
func migrationPolicyCancelsALiveMigration(t *testing.T, c *localCluster) {
	c.kubectl("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata: {name: policed, namespace: default, labels: {app: policed}}\nspec: {}\n", "apply", "-f", "-")
	var node string
	testenv.Eventually(t, 3*time.Minute, "machine policed Running", func() (bool, string) {
		state := c.jsonpath("machine", "policed", "{.status.phase} {.spec.nodeName}")
		c.stopIfFailed("policed", state)
		fields := strings.Fields(state)
		if len(fields) != 2 {
			return false, state
		}
		node = fields[1]
		return fields[0] == "Running", state
	})
	// One console per QEMU: its socket takes one client at a time.
	con := c.console(node, "default", "policed")
	state := startGuestState(t, con)
	c.kubectl(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: MigrationPolicy
metadata: {name: slow-link}
spec:
  selectors: {machineSelector: {app: policed}}
  bandwidthPerMigration: 1Mi
  completionTimeoutPerGiB: 12
  allowAutoConverge: true
`, "apply", "-f", "-")

	phase, reason, message := c.migrate("slow", "policed", "live")
	t.Logf("under the policy: %s %s: %s", phase, reason, message)
	if phase != "Failed" || reason != "CompletionTimeout" ||
		!strings.Contains(message, "cancelled under MigrationPolicy slow-link") || !strings.Contains(message, "keeps running on "+node) {
		t.Fatalf("migration under the policy: %s %s: %s; want Failed CompletionTimeout naming the policy", phase, reason, message)
	}
	if got := c.jsonpath("machinemigration", "slow", "{.status.migrationPolicy.name} {.status.migrationPolicy.bandwidthPerMigration} {.status.migrationPolicy.completionTimeoutSeconds} {.status.migrationPolicy.allowAutoConverge}"); got != "slow-link 1Mi 3 true" {
		t.Errorf("status.migrationPolicy %q, want slow-link 1Mi 3 true", got)
	}
	if at := c.jsonpath("machine", "policed", "{.spec.nodeName} {.status.phase}"); at != node+" Running" {
		t.Fatalf("after the cancelled migration the machine is %q, want Running on %s", at, node)
	}
	state = checkGuestKeptState(t, con, state, "after the cancelled migration")

	// A target that hangs mid-stream: its agent is stopped (SIGSTOP) once
	// its QEMU waits for the guest, so the stream stalls and the RAM left
	// to send stops shrinking. The policy now has a 3 s progress timeout
	// and no completion timeout, at 2 MiB/s (the migration needs far
	// longer, so it is caught mid-stream).
	c.kubectl(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: MigrationPolicy
metadata: {name: slow-link}
spec:
  selectors: {machineSelector: {app: policed}}
  bandwidthPerMigration: 2Mi
  progressTimeout: 3
`, "apply", "-f", "-")
	target := otherNode(node)
	c.kubectl(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachineMigration
metadata: {name: stalled, namespace: default}
spec: {machineName: policed, strategy: live}
`, "apply", "-f", "-")
	testenv.Eventually(t, time.Minute, "the target's QEMU to wait for the guest", func() (bool, string) {
		vms := vmProcesses(t, filepath.Join(c.dataDir, "nodes", target))
		return vms["default/policed"] != 0, fmt.Sprint(vms, " ", c.jsonpath("machinemigration", "stalled", "{.status.phase} {.status.reason}"))
	})
	agent := c.agentPID(target)
	if err := syscall.Kill(agent, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(agent, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	var got string
	testenv.Eventually(t, 2*time.Minute, "migration stalled to end", func() (bool, string) {
		got = c.jsonpath("machinemigration", "stalled", "{.status.phase}|{.status.reason}|{.status.message}")
		return strings.HasPrefix(got, "Succeeded|") || strings.HasPrefix(got, "Failed|"), got
	})
	resume()
	t.Logf("stalled stream: %s", got)
	if !strings.HasPrefix(got, "Failed|NoProgress|") || !strings.Contains(got, "cancelled under MigrationPolicy slow-link") ||
		!strings.Contains(got, "keeps running on "+node) {
		t.Fatalf("migration into a hung target: %s; want Failed NoProgress naming the policy", got)
	}
	if at := c.jsonpath("machine", "policed", "{.spec.nodeName} {.status.phase}"); at != node+" Running" {
		t.Fatalf("after the stalled migration the machine is %q, want Running on %s", at, node)
	}
	state = checkGuestKeptState(t, con, state, "after the stalled migration")
	// The target, running again, drops what it had loaded.
	testenv.Eventually(t, time.Minute, "no VM left on "+target, func() (bool, string) {
		left := vmProcesses(t, filepath.Join(c.dataDir, "nodes", target))
		return len(left) == 0, fmt.Sprint(left)
	})

	c.kubectl("", "delete", "migrationpolicy", "slow-link")
	phase, reason, message = c.migrate("free", "policed", "live")
	if phase != "Succeeded" {
		t.Fatalf("migration without the policy: %s %s: %s", phase, reason, message)
	}
	if got := c.jsonpath("machinemigration", "free", "{.status.migrationPolicy}"); got != "" {
		t.Errorf("a migration no policy selects recorded %q", got)
	}
	checkGuestKeptState(t, c.console(otherNode(node), "default", "policed"), state, "after the live migration without the policy")
	c.kubectl("", "delete", "machine", "policed", "--timeout=60s")
}

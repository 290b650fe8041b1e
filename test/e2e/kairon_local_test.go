package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// TestKaironLocal runs, one after the other, the tests that need a
// kairon-local of two QEMU nodes with the default sizes, on one: each of
// its starts took a control plane, kairon-controller and two agents from
// nothing (about 12 s of both cores), and its stops more. Each test keeps
// to Machines and objects of its own names, and deletes them; between two,
// whatever one left (on a failure, say) is deleted and its VMs waited out,
// so the next starts on an empty cluster. The restart test comes last: it
// stops the cluster and ends with down --purge.
func TestKaironLocal(t *testing.T) {
	c := startKaironLocal(t, 2)
	tests := []struct {
		name string
		run  func(*testing.T, *localCluster)
	}{
		{"RunsRealVMs", kaironLocalRunsRealVMs},
		{"MigrationPolicyCancelsALiveMigration", migrationPolicyCancelsALiveMigration},
		{"SnapshotScheduleAndRestoreOnAnotherNode", snapshotScheduleAndRestoreOnAnotherNode},
		{"SuspendsVMsAcrossRestarts", kaironLocalSuspendsVMsAcrossRestarts},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The test's own view: its failures and clean-ups are its own.
			view := *c
			view.t = t
			tc.run(t, &view)
		})
		if i < len(tests)-1 {
			c.clearDefaultNamespace()
		}
	}
}

// clearDefaultNamespace deletes what a test may have left on the cluster
// (all of its objects are in namespace default, but MigrationPolicies)
// and waits until no VM runs.
func (c *localCluster) clearDefaultNamespace() {
	c.t.Helper()
	c.kubectl("", "delete", "machineclaims,machinepools,machinesets,machines,machinemigrations,snapshotschedules,machinesnapshots",
		"--all", "-n", "default", "--timeout=2m")
	c.kubectl("", "delete", "migrationpolicies", "--all", "--timeout=1m")
	testenv.Eventually(c.t, 2*time.Minute, "no VM left between tests", func() (bool, string) {
		vms := vmProcesses(c.t, c.dataDir)
		return len(vms) == 0, fmt.Sprint(vms)
	})
}

// What `make up` runs: kairon-local with the control plane, kairon-controller
// and QEMU-backed agents. Its kubeconfig lists the nine CRDs, and a Machine
// applied with kubectl boots a real VM that answers on its address. The
// agents' network lives in a namespace the test creates.
func kaironLocalRunsRealVMs(t *testing.T, c *localCluster) {
	crds := c.kubectl("", "get", "crd", "-o", "name")
	for _, plural := range []string{"machines", "machinesets", "machinepools", "machineclaims",
		"machinedisruptionbudgets", "machinemigrations", "machinenetworkpolicies", "machinequotas", "migrationpolicies",
		"machinesnapshots", "snapshotschedules"} {
		if !strings.Contains(crds, "customresourcedefinition.apiextensions.k8s.io/"+plural+".kairon.zyvor.dev\n") {
			t.Errorf("CRD %s.kairon.zyvor.dev missing:\n%s", plural, crds)
		}
	}

	c.kubectl("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata: {name: local, namespace: default}\nspec: {}\n", "apply", "-f", "-")
	var address string
	testenv.Eventually(t, 3*time.Minute, "machine local Running", func() (bool, string) {
		state := c.jsonpath("machine", "local", "{.status.phase} {.status.addresses[0].address}")
		c.stopIfFailed("local", state)
		phase, addr, _ := strings.Cut(state, " ")
		address = addr
		return phase == "Running" && addr != "", state
	})
	if page, err := getInNetNS(c.netNS, "http://"+address+":8080/"); err != nil || !strings.Contains(page, "kairon guest local") {
		t.Errorf("guest at %s did not answer: %v %q", address, err, page)
	}
	c.kubectl("", "delete", "machine", "local", "--timeout=60s")
	if vms := vmProcesses(t, c.dataDir); len(vms) != 0 {
		t.Errorf("VMs left after delete: %v", vms)
	}
}

// machineEvents lists the events of one reason on a Machine, as
// "Type|message" lines.
func (c *localCluster) machineEvents(machine, reason string) []string {
	c.t.Helper()
	out := c.query(testenv.Query{Namespace: "default", Resource: "events", FieldSelector: "involvedObject.kind=Machine,involvedObject.name=" + machine + ",reason=" + reason},
		`{range .items[*]}{.type}|{.message}{"\n"}{end}`)
	var events []string
	for _, line := range strings.Split(out, "\n") {
		if line != "" {
			events = append(events, line)
		}
	}
	return events
}

// The promise: stop kairon-local with SIGTERM (or Ctrl-C), and no
// VM keeps running; run it again, and the guests go on from where they
// were, memory and all. Then `down` stops a running kairon-local the same
// way, and `down --purge` deletes its data dir.
func kaironLocalSuspendsVMsAcrossRestarts(t *testing.T, c *localCluster) {
	machines := []string{"counter-a", "counter-b"}
	for _, name := range machines {
		c.kubectl(fmt.Sprintf("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata: {name: %s, namespace: default}\nspec: {}\n", name), "apply", "-f", "-")
	}
	nodes := map[string]string{}
	for _, name := range machines {
		testenv.Eventually(t, 3*time.Minute, "machine "+name+" Running", func() (bool, string) {
			state := c.jsonpath("machine", name, "{.status.phase} {.spec.nodeName}")
			c.stopIfFailed(name, state)
			phase, node, _ := strings.Cut(state, " ")
			nodes[name] = node
			return phase == "Running" && node != "", state
		})
	}
	before := map[string]guestState{}
	for _, name := range machines {
		con := c.console(nodes[name], "default", name)
		startGuestState(t, con)
		// Let it count for a moment on its own clock, so that a reset shows.
		con.Expect(t, "while [ $(cat /tmp/counter) -lt 20 ]; do usleep 50000; done; echo twenty:$((10+10)).", regexp.MustCompile(`twenty:20\.`), time.Minute)
		before[name] = readGuestState(t, con)
		t.Logf("%s on %s: token %d, counter at %d", name, nodes[name], before[name].token, before[name].counter)
	}

	began := time.Now()
	out := c.stop()
	t.Logf("kairon-local stopped in %s:\n%s", time.Since(began).Round(time.Millisecond), tail(out, 6))
	if vms := vmProcesses(t, c.dataDir); len(vms) != 0 {
		t.Fatalf("QEMU processes left after SIGTERM: %v", vms)
	}
	if !strings.Contains(out, "2 VM(s) saved") {
		t.Errorf("kairon-local did not report the saved VMs:\n%s", tail(out, 10))
	}

	c.up()
	consoles := map[string]*testenv.Console{}
	for _, name := range machines {
		suspended := c.machineEvents(name, kaironv1.EventReasonSuspended)
		if len(suspended) != 1 || !strings.HasPrefix(suspended[0], "Normal|") {
			t.Errorf("%s: Suspended events %q, want one Normal", name, suspended)
		} else {
			t.Logf("%s: %s", name, suspended[0])
		}
		var resumed []string
		testenv.Eventually(t, 3*time.Minute, "a Resumed event on "+name, func() (bool, string) {
			resumed = c.machineEvents(name, kaironv1.EventReasonResumed)
			return len(resumed) > 0, c.jsonpath("machine", name, "{.status.phase}: {.status.message}")
		})
		if !strings.HasPrefix(resumed[0], "Normal|") || !strings.Contains(resumed[0], "paused for ") {
			t.Errorf("%s: Resumed event %q, want Normal and naming the pause", name, resumed[0])
		}
		t.Logf("%s: %s", name, resumed[0])
		if got := c.jsonpath("machine", name, "{.status.phase} {.spec.nodeName}"); got != "Running "+nodes[name] {
			t.Errorf("%s after the restart: %q, want Running on %s", name, got, nodes[name])
		}
		// The console serves one client at a time: this one stays for later.
		consoles[name] = c.console(nodes[name], "default", name)
		now := checkGuestKeptState(t, consoles[name], before[name], name+" after kairon-local restarted")
		t.Logf("%s: token %d kept, counter went on from %d to %d", name, now.token, before[name].counter, now.counter)
	}

	// A kairon-local killed outright saves nothing: its VMs run on, and the
	// next up adopts them as they are.
	running := vmProcesses(t, c.dataDir)
	if len(running) != 2 {
		t.Fatalf("want the 2 VMs running before the kill, found %v", running)
	}
	if err := c.proc.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "kairon-local and its processes gone after SIGKILL", func() (bool, string) {
		procs, err := host.Processes(c.dataDir)
		return c.hasExited() && err == nil && len(procs) == 0, fmt.Sprint(procs, err)
	})
	if after := vmProcesses(t, c.dataDir); fmt.Sprint(after) != fmt.Sprint(running) {
		t.Fatalf("VMs after SIGKILL %v, want them untouched: %v", after, running)
	}
	// The killed API server's connections may hold its port for a while
	// (FIN_WAIT2) after it is gone; the next up needs the same port.
	testenv.Eventually(t, 2*time.Minute, "the API server's port free again after SIGKILL", func() (bool, string) {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)))
		if err != nil {
			return false, err.Error()
		}
		l.Close()
		return true, ""
	})
	c.up()
	for _, name := range machines {
		testenv.Eventually(t, time.Minute, name+" Running after the kill", func() (bool, string) {
			state := c.jsonpath("machine", name, "{.status.phase}")
			c.stopIfFailed(name, state)
			return state == "Running", state
		})
		checkGuestKeptState(t, consoles[name], before[name], name+" after kairon-local was killed")
	}
	if after := vmProcesses(t, c.dataDir); fmt.Sprint(after) != fmt.Sprint(running) {
		t.Errorf("VMs after the next up %v, want the same processes adopted: %v", after, running)
	}

	// `down` stops the running kairon-local as SIGTERM does: the VMs are
	// saved, none keeps running.
	down := exec.Command(filepath.Join(c.binDir, "kairon-local"), "down", "--data-dir", c.dataDir)
	text, err := down.CombinedOutput()
	t.Logf("kairon-local down:\n%s", text)
	if err != nil {
		t.Fatalf("kairon-local down: %v", err)
	}
	out = c.waitExit("kairon-local down")
	if vms := vmProcesses(t, c.dataDir); len(vms) != 0 {
		t.Errorf("QEMU processes left after down: %v", vms)
	}
	if !strings.Contains(out, "2 VM(s) saved") {
		t.Errorf("kairon-local did not save the VMs when stopped by down:\n%s", tail(out, 10))
	}

	purge := exec.Command(filepath.Join(c.binDir, "kairon-local"), "down", "--purge", "--data-dir", c.dataDir)
	if text, err := purge.CombinedOutput(); err != nil || !strings.Contains(string(text), "deleted "+c.dataDir) {
		t.Errorf("kairon-local down --purge: %v\n%s", err, text)
	}
	if _, err := os.Stat(c.dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the data dir is still there after down --purge: %v", err)
	}
	// Nothing would reuse the guest network any more: the bridge, the
	// VMs' taps and the nftables tables are gone with the data dir.
	links, err := exec.Command("ip", "-n", c.netNS, "-o", "link", "show").CombinedOutput()
	if err != nil {
		t.Fatalf("ip link in %s: %v: %s", c.netNS, err, links)
	}
	for _, line := range strings.Split(string(links), "\n") {
		if f := strings.Fields(line); len(f) > 1 && (strings.HasPrefix(f[1], "kairon0") || strings.HasPrefix(f[1], "kt")) {
			t.Errorf("down --purge left link %s in %s", strings.TrimSuffix(f[1], ":"), c.netNS)
		}
	}
	tables, err := exec.Command("ip", "netns", "exec", c.netNS, "nft", "list", "tables").CombinedOutput()
	if err != nil || strings.Contains(string(tables), "kairon") {
		t.Errorf("down --purge left nftables tables in %s (%v):\n%s", c.netNS, err, tables)
	}
}

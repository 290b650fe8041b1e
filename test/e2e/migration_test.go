package e2e

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// localCluster is a kairon-local run by a test, on a data dir and network
// namespace of the test's own, started (up) and stopped (stop) as often as
// the test wants.
type localCluster struct {
	t          *testing.T
	binDir     string
	dataDir    string
	kubeconfig string
	netNS      string
	nodes      int
	port       int
	// flags are up's sizing and timing flags (nil: 2 vCPUs and 1Gi a node).
	flags []string
	// proc is the running `kairon-local up`, nil when none; out its output.
	proc   *exec.Cmd
	exited chan struct{}
	out    string
}

// startKaironLocal runs `kairon-local up` with nodes QEMU agents, their
// network in a namespace the test creates, and waits until it is up. Every
// process and VM ends with the test.
func startKaironLocal(t *testing.T, nodes int) *localCluster {
	t.Helper()
	// Not t.TempDir(): it holds the test's name, and the VMs' unix sockets
	// below the data dir must fit in 108 bytes.
	dataDir, err := os.MkdirTemp("", "kairon-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dataDir) })
	c := &localCluster{t: t, binDir: testenv.BinDir(t), netNS: netns(t), dataDir: dataDir, nodes: nodes, port: stablePort(t)}
	c.kubeconfig = filepath.Join(c.dataDir, "kubeconfig")
	t.Cleanup(func() { killVMs(t, c.dataDir) })
	c.up()
	return c
}

// stablePort is a free port for the API server, kept across restarts as a
// data dir keeps its port. Not 6443, which every other kairon-local on the
// machine tries first, nor one of the ephemeral range (the kernel's own
// choice for Listen(":0") and for outgoing connections), where another
// process may take it while the cluster is down.
func stablePort(t *testing.T) int {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free port between 20000 and 32000")
	return 0
}

// up starts kairon-local on the cluster's data dir and waits until it is up.
func (c *localCluster) up() {
	t := c.t
	t.Helper()
	c.out = filepath.Join(t.TempDir(), "out")
	log, err := os.Create(c.out)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	flags := c.flags
	if flags == nil {
		flags = []string{"--node-cpu", "2", "--node-memory", "1Gi"}
	}
	up := exec.Command(filepath.Join(c.binDir, "kairon-local"), append([]string{"up", "--data-dir", c.dataDir, "--port", strconv.Itoa(c.port),
		"--nodes", strconv.Itoa(c.nodes), "--netns", c.netNS,
		// No test here reads the dashboard or uses the registry, and their
		// fixed ports are shared with whatever else runs kairon-local on
		// this host meanwhile.
		"--ui=false", "--registry=false"}, flags...)...)
	up.Stdout, up.Stderr = log, log
	up.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = up.Wait(); close(exited) }()
	c.proc, c.exited = up, exited
	out := c.out
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = up.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(4 * time.Minute):
				_ = up.Process.Kill()
				<-exited
			}
		}
		if t.Failed() {
			text, _ := os.ReadFile(out)
			t.Logf("kairon-local output (%s):\n%s", out, tail(string(text), 40))
		}
	})
	testenv.Eventually(t, 3*time.Minute, "kairon-local up", func() (bool, string) {
		text, _ := os.ReadFile(out)
		if c.hasExited() {
			t.Fatalf("kairon-local exited (%v) before it was up:\n%s", up.ProcessState, tail(string(text), 20))
		}
		return strings.Contains(string(text), "kairon-local is up"), tail(string(text), 3)
	})
}

func (c *localCluster) hasExited() bool {
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// output is what the last kairon-local printed.
func (c *localCluster) output() string {
	text, _ := os.ReadFile(c.out)
	return string(text)
}

// waitExit waits for kairon-local to end (its agents may take a while to
// save the VMs) and expects status 0; it returns the output.
func (c *localCluster) waitExit(after string) string {
	c.t.Helper()
	testenv.Eventually(c.t, 4*time.Minute, "kairon-local to exit after "+after, func() (bool, string) {
		return c.hasExited(), tail(c.output(), 3)
	})
	if code := c.proc.ProcessState.ExitCode(); code != 0 {
		c.t.Errorf("kairon-local exited with %d after %s, want 0:\n%s", code, after, tail(c.output(), 20))
	}
	return c.output()
}

// stop sends kairon-local SIGTERM and waits for it; it returns the output.
func (c *localCluster) stop() string {
	c.t.Helper()
	if err := c.proc.Process.Signal(syscall.SIGTERM); err != nil {
		c.t.Fatal(err)
	}
	return c.waitExit("SIGTERM")
}

// kubectl runs kubectl against the cluster and fails the test on an error.
func (c *localCluster) kubectl(stdin string, args ...string) string {
	c.t.Helper()
	return testenv.Kubectl(c.t, c.binDir, c.kubeconfig, stdin, args...)
}

// jsonpath reads one field of an object, as kubectl get -o jsonpath does
// but without a kubectl process: the tests poll with it.
func (c *localCluster) jsonpath(kind, name, path string) string {
	c.t.Helper()
	return c.query(testenv.Query{Resource: kind, Name: name}, path)
}

// listJSONPath reads the objects of kind that match the label selector, as
// kubectl get -l -o jsonpath does, in this process.
func (c *localCluster) listJSONPath(kind, selector, path string) string {
	c.t.Helper()
	return c.query(testenv.Query{Resource: kind, LabelSelector: selector}, path)
}

// query reads what q names through the jsonpath template; an error ends
// the test.
func (c *localCluster) query(q testenv.Query, path string) string {
	c.t.Helper()
	out, err := testenv.JSONPath(c.kubeconfig, q, path)
	if err != nil {
		c.t.Fatalf("get %+v -o jsonpath=%s: %v", q, path, err)
	}
	return out
}

// stopIfFailed ends the test at once when machine, which the test waits to
// see run, is Failed (state starts with its phase): a Failed Machine stays
// failed, so waiting out the deadline would only cost minutes.
func (c *localCluster) stopIfFailed(machine, state string) {
	c.t.Helper()
	if strings.HasPrefix(state, string(kaironv1.MachineFailed)) {
		c.t.Fatalf("machine %s failed while the test waited for it to run: %s",
			machine, c.jsonpath("machine", machine, `on {.spec.nodeName}, {.status.conditions[?(@.type=="Ready")].reason}: {.status.message}`))
	}
}

// agentPID finds the kairon-node process serving node.
func (c *localCluster) agentPID(node string) int {
	c.t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(raw), "\x00")
		if strings.HasSuffix(args[0], "kairon-node") && strings.Contains(string(raw), "\x00--node-name\x00"+node+"\x00") &&
			strings.Contains(string(raw), c.dataDir) {
			return pid
		}
	}
	c.t.Fatalf("no kairon-node process for %s", node)
	return 0
}

// console connects to the serial console of a Machine's VM on node. A
// failed Expect shows the end of the VM's console log and QEMU's log there.
func (c *localCluster) console(node, namespace, machine string) *testenv.Console {
	c.t.Helper()
	dir := filepath.Join(c.dataDir, "nodes", node, "instances", namespace+"_"+machine)
	return testenv.DialConsole(c.t, filepath.Join(dir, "console.sock")).
		WithLogs(filepath.Join(dir, "console.log"), filepath.Join(dir, "qemu.log"))
}

var (
	tokenOutput   = regexp.MustCompile(`token:(\d+)\.`)
	counterOutput = regexp.MustCompile(`counter:(\d+)\.`)
)

// guestState is what the test keeps inside the guest: a token in a file on
// the guest's tmpfs and a counter a guest process increments ten times a
// second. Both live only in guest memory.
type guestState struct {
	token, counter int
}

func readGuestState(t *testing.T, con *testenv.Console) guestState {
	t.Helper()
	token, _ := strconv.Atoi(con.Expect(t, "echo token:$(cat /tmp/token).", tokenOutput, 30*time.Second)[1])
	counter, _ := strconv.Atoi(con.Expect(t, "echo counter:$(cat /tmp/counter).", counterOutput, 30*time.Second)[1])
	return guestState{token: token, counter: counter}
}

// checkGuestKeptState: same token, the counter went on from where it was
// (never back to zero, as after a reboot) and still counts.
func checkGuestKeptState(t *testing.T, con *testenv.Console, before guestState, after string) guestState {
	t.Helper()
	now := readGuestState(t, con)
	if now.token != before.token {
		t.Errorf("%s: token %d, want %d: the guest lost its memory", after, now.token, before.token)
	}
	if now.counter < before.counter {
		t.Errorf("%s: counter went back from %d to %d: the guest restarted", after, before.counter, now.counter)
	}
	// The guest waits, on its own clock, until its counter moves on.
	con.Expect(t, "c=$(cat /tmp/counter); while [ \"$(cat /tmp/counter)\" = \"$c\" ]; do usleep 20000; done; echo counting:$((1+1)).",
		regexp.MustCompile(`counting:2\.`), 30*time.Second)
	return now
}

// startGuestState puts a token and a running counter into the guest's
// memory and returns what they are.
func startGuestState(t *testing.T, con *testenv.Console) guestState {
	t.Helper()
	token := rand.IntN(1_000_000) + 1000
	con.Expect(t, fmt.Sprintf("echo %d > /tmp/token; echo wrote:$((%d+1)).", token, token), regexp.MustCompile(fmt.Sprintf(`wrote:%d\.`, token+1)), 30*time.Second)
	// Written aside and renamed into place: a reader never catches the file
	// truncated by ">" and not yet written (seen once: "counter:.").
	con.Expect(t, "(i=0; while :; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; usleep 100000; done) & echo started:$((1+1)).", regexp.MustCompile(`started:2\.`), 30*time.Second)
	// Until the counter's first write, on the guest's side.
	con.Expect(t, "while [ ! -s /tmp/counter ]; do usleep 20000; done; echo counter-file:$((1+1)).", regexp.MustCompile(`counter-file:2\.`), 30*time.Second)
	return readGuestState(t, con)
}

// migrate creates a MachineMigration with kubectl and waits for it to end.
func (c *localCluster) migrate(name, machine, strategy string) (phase, reason, message string) {
	c.t.Helper()
	c.kubectl(fmt.Sprintf(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachineMigration
metadata: {name: %s, namespace: default}
spec: {machineName: %s, strategy: %s}
`, name, machine, strategy), "apply", "-f", "-")
	var state string
	testenv.Eventually(c.t, 3*time.Minute, "migration "+name+" to end", func() (bool, string) {
		state = c.jsonpath("machinemigration", name, "{.status.phase}|{.status.reason}|{.status.message}")
		return strings.HasPrefix(state, "Succeeded|") || strings.HasPrefix(state, "Failed|"), state
	})
	parts := strings.SplitN(state, "|", 3)
	return parts[0], parts[1], parts[2]
}

// plainTextAnswer sends a live migration request without TLS and returns
// the first line of whatever comes back.
func plainTextAnswer(t *testing.T, endpoint string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", endpoint, 10*time.Second)
	if err != nil {
		t.Fatalf("migration endpoint %q: %v", endpoint, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write([]byte("KAIRON-LIVE/1 default no-such-migration\n")); err != nil {
		return ""
	}
	line, _ := bufio.NewReader(conn).ReadString('\n')
	return line
}

func otherNode(node string) string {
	if node == "node-1" {
		return "node-2"
	}
	return "node-1"
}

// newcomerOnTheNodeLeft is issue 42's reproduction: a Machine of another
// namespace started on the node a guest migrated away from gets an
// address of its own, not the migrated guest's, and each guest answers at
// its own address. Then it goes, so the rest of the test finds the node
// as it was.
func newcomerOnTheNodeLeft(t *testing.T, c *localCluster, left, movedAddress string) {
	t.Helper()
	c.kubectl("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-b}\n", "apply", "-f", "-")
	c.kubectl("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata: {name: newcomer, namespace: team-b}\nspec: {nodeName: "+left+"}\n", "apply", "-f", "-")
	var address string
	testenv.Eventually(t, 3*time.Minute, "machine team-b/newcomer Running", func() (bool, string) {
		state := c.query(testenv.Query{Namespace: "team-b", Resource: "machine", Name: "newcomer"}, "{.status.phase} {.status.addresses[0].address}")
		if strings.HasPrefix(state, string(kaironv1.MachineFailed)) {
			t.Fatalf("machine team-b/newcomer failed: %s", state)
		}
		fields := strings.Fields(state)
		if len(fields) != 2 {
			return false, state
		}
		address = fields[1]
		return fields[0] == "Running", state
	})
	if address == movedAddress {
		t.Errorf("a new Machine of namespace team-b on %s got %s, the address of default/mover that migrated away from it", left, address)
	}
	checkAddressesUnique(t, c.env(), "a new Machine on the node a guest left")
	for name, at := range map[string]string{"newcomer": address, "mover": movedAddress} {
		if page, err := getInNetNS(c.netNS, "http://"+at+":8080/"); err != nil || !strings.Contains(page, "kairon guest "+name) {
			t.Errorf("guest %s did not answer at its address %s: %v %q", name, at, err, page)
		}
	}
	c.kubectl("", "delete", "namespace", "team-b", "--timeout=90s")
}

// TestMigrationKeepsTheGuestState moves a running guest between the two
// nodes of kairon-local, cold then live, and checks what the guest holds in
// memory after each move; then a live migration whose target does not
// answer fails and leaves the guest running, unchanged, on its node.
func TestMigrationKeepsTheGuestState(t *testing.T) {
	c := startKaironLocal(t, 2)
	c.kubectl("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata: {name: mover, namespace: default}\nspec: {}\n", "apply", "-f", "-")
	var node, address string
	testenv.Eventually(t, 3*time.Minute, "machine mover Running", func() (bool, string) {
		state := c.jsonpath("machine", "mover", "{.status.phase} {.spec.nodeName} {.status.addresses[0].address}")
		c.stopIfFailed("mover", state)
		fields := strings.Fields(state)
		if len(fields) != 3 {
			return false, state
		}
		node, address = fields[1], fields[2]
		return fields[0] == "Running", state
	})
	answers := func(when string) {
		t.Helper()
		if page, err := getInNetNS(c.netNS, "http://"+address+":8080/"); err != nil || !strings.Contains(page, "kairon guest mover") {
			t.Errorf("%s: the guest did not answer at %s: %v %q", when, address, err, page)
		}
	}
	answers("before any migration")
	con := c.console(node, "default", "mover")
	state := startGuestState(t, con)

	for _, strategy := range []string{"cold", "live"} {
		source, target := node, otherNode(node)
		phase, reason, message := c.migrate("move-"+strategy, "mover", strategy)
		if phase != "Succeeded" {
			t.Fatalf("%s migration %s/%s: %s", strategy, phase, reason, message)
		}
		downtime := c.jsonpath("machinemigration", "move-"+strategy, "{.status.downtimeMillis}")
		t.Logf("%s migration %s → %s: %s, downtime %s ms", strategy, source, target, message, downtime)
		if got := c.jsonpath("machine", "mover", "{.spec.nodeName}"); got != target {
			t.Fatalf("after the %s migration the machine is on %q, want %s", strategy, got, target)
		}
		node = target
		testenv.Eventually(t, time.Minute, "no VM left on "+source, func() (bool, string) {
			left := vmProcesses(t, filepath.Join(c.dataDir, "nodes", source))
			return len(left) == 0, fmt.Sprint(left)
		})
		if vms := vmProcesses(t, filepath.Join(c.dataDir, "nodes", target)); vms["default/mover"] == 0 {
			t.Errorf("no QEMU for default/mover on %s: %v", target, vms)
		}
		con = c.console(node, "default", "mover")
		state = checkGuestKeptState(t, con, state, "after the "+strategy+" migration")
		if got := c.jsonpath("machine", "mover", "{.status.addresses[0].address}"); got != address {
			t.Errorf("after the %s migration the machine reports address %q, want its %s kept", strategy, got, address)
		}
		answers("after the " + strategy + " migration")
		if strategy == "cold" {
			newcomerOnTheNodeLeft(t, c, source, address)
		}
	}

	// kairon-local's agents speak TLS on their migration endpoints: a
	// plain-text request gets no protocol answer.
	endpoint := c.jsonpath("node", otherNode(node), `{.metadata.annotations.kairon\.zyvor\.dev/migration-endpoint}`)
	if answer := plainTextAnswer(t, endpoint); strings.HasPrefix(answer, "OK") || strings.HasPrefix(answer, "ERR") {
		t.Errorf("the migration endpoint %s answered plain text %q: TLS is off", endpoint, answer)
	}

	// A target that does not answer: its agent is stopped (SIGSTOP), so the
	// source's request times out before any state leaves it.
	target := otherNode(node)
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
	phase, reason, message := c.migrate("move-fail", "mover", "live")
	resume()
	if phase != "Failed" || reason != "TargetUnreachable" {
		t.Errorf("migration to a stopped agent: %s/%s: %s; want Failed/TargetUnreachable", phase, reason, message)
	}
	t.Logf("failed as expected: %s: %s", reason, message)
	if got := c.kubectl("", "get", "machine", "mover", "-o", "jsonpath={.spec.nodeName} {.status.phase}"); got != node+" Running" {
		t.Errorf("after the failed migration the machine is %q, want %q", got, node+" Running")
	}
	checkGuestKeptState(t, con, state, "after the failed migration")
	if vms := vmProcesses(t, filepath.Join(c.dataDir, "nodes", target)); len(vms) != 0 {
		t.Errorf("the failed migration left VMs on %s: %v", target, vms)
	}

	c.kubectl("", "delete", "machine", "mover", "--timeout=60s")
	if vms := vmProcesses(t, c.dataDir); len(vms) != 0 {
		t.Errorf("VMs left after delete: %v", vms)
	}
}

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// probeLog is where a guest's probe writes its timestamped replies.
const probeLog = "/tmp/kairon-probe.log"

// execIn runs a command in the guest of namespace/machine through
// kaironctl exec and returns its output.
func (h *crossNodeHosts) execIn(namespace, machine, script string) (string, error) {
	out, err := exec.Command(filepath.Join(h.env.BinDir, "kaironctl"), "--kubeconfig", h.env.Kubeconfig, "-n", namespace,
		"exec", machine, "--", "sh", "-c", script).CombinedOutput()
	return string(out), err
}

// startProbe has the guest of namespace/machine ping target every 20 ms
// from its own shell, each reply stamped by the guest's clock (busybox ts,
// microseconds), into probeLog: a measure of reachability that no round
// trip of the test's own adds to. It returns once the first reply is in.
func (h *crossNodeHosts) startProbe(namespace, machine, target string) {
	h.t.Helper()
	if out, err := h.execIn(namespace, machine, "rm -f "+probeLog+"; setsid sh -c 'ping -i 0.02 "+target+" | ts %.s >"+probeLog+
		"' </dev/null >/dev/null 2>&1 &"); err != nil {
		h.t.Fatalf("starting the probe in %s/%s: %v: %s", namespace, machine, err, out)
	}
	testenv.Eventually(h.t, time.Minute, namespace+"/"+machine+"'s probe to get a reply from "+target, func() (bool, string) {
		out, err := h.execIn(namespace, machine, "grep -c 'bytes from' "+probeLog)
		return err == nil && strings.TrimSpace(out) != "0", fmt.Sprint(out, err)
	})
}

// probeReply is one reply the probe logged: the guest's time and the
// echo's sequence number.
type probeReply struct {
	at  float64
	seq int
}

var probeLine = regexp.MustCompile(`^(\d+\.\d+) \d+ bytes from [0-9.]+: seq=(\d+) `)

// readProbe returns the replies logged so far.
func (h *crossNodeHosts) readProbe(namespace, machine string) []probeReply {
	h.t.Helper()
	out, err := h.execIn(namespace, machine, "cat "+probeLog)
	if err != nil {
		h.t.Fatalf("reading the probe of %s/%s: %v: %s", namespace, machine, err, out)
	}
	return parseProbe(out)
}

func parseProbe(log string) []probeReply {
	var replies []probeReply
	for _, line := range strings.Split(log, "\n") {
		m := probeLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, _ := strconv.ParseFloat(m[1], 64)
		seq, _ := strconv.Atoi(m[2])
		replies = append(replies, probeReply{at: at, seq: seq})
	}
	return replies
}

// probeOutage is the longest silence of a probe: the time between the two
// replies around it and how many echoes went unanswered in between.
type probeOutage struct {
	gap  time.Duration
	lost int
	// before and after are the probe's replies, in the guest's time.
	before, after float64
}

func (o probeOutage) String() string {
	return fmt.Sprintf("%s without a reply (%d echoes lost)", o.gap.Round(time.Millisecond), o.lost)
}

// longestOutage finds the longest silence between replies.
func longestOutage(replies []probeReply) probeOutage {
	var o probeOutage
	for i := 1; i < len(replies); i++ {
		prev, cur := replies[i-1], replies[i]
		if gap := time.Duration((cur.at - prev.at) * float64(time.Second)); gap > o.gap {
			o = probeOutage{gap: gap, lost: cur.seq - prev.seq - 1, before: prev.at, after: cur.at}
		}
	}
	return o
}

// stopProbe ends the guest's probe.
func (h *crossNodeHosts) stopProbe(namespace, machine string) {
	h.t.Helper()
	if out, err := h.execIn(namespace, machine, "killall ping"); err != nil {
		h.t.Errorf("stopping the probe of %s/%s: %v: %s", namespace, machine, err, out)
	}
}

// probeAcrossMove migrates namespace/mover to node with strategy while the
// guest prober pings it, waits until the probe has replies again after
// the migration succeeded, and returns the longest silence the prober saw
// from the moment the migration was created.
func (h *crossNodeHosts) probeAcrossMove(namespace, prober, mover, address, migration, strategy, node string) probeOutage {
	h.t.Helper()
	start := h.replies(namespace, prober)
	migrateTo(h.t, h.env, namespace, migration, mover, strategy, node)
	m := waitPhase(h.t, h.env, client.ObjectKey{Namespace: namespace, Name: mover}, kaironv1.MachineRunning)
	if m.Spec.NodeName != node || len(m.Status.Addresses) == 0 || m.Status.Addresses[0].Address != address {
		h.t.Fatalf("after migration %s: node %q, addresses %v; want %s and %s", migration, m.Spec.NodeName, m.Status.Addresses, node, address)
	}
	// Replies again after the switch: a reply logged after the agent
	// reported the guest Running there.
	done := h.replies(namespace, prober)
	testenv.Eventually(h.t, 2*time.Minute, prober+"'s probe of "+address+" to get replies after the migration", func() (bool, string) {
		now := h.replies(namespace, prober)
		return now > done+5, fmt.Sprintf("%d replies, %d when the migration was seen done", now, done)
	})
	replies := h.readProbe(namespace, prober)
	if start == 0 || len(replies) <= start {
		h.t.Fatalf("the probe logged %d replies, %d before the migration", len(replies), start)
	}
	// From the last reply before the migration was created.
	return longestOutage(replies[start-1:])
}

// replies counts the probe's replies so far.
func (h *crossNodeHosts) replies(namespace, prober string) int {
	h.t.Helper()
	out, err := h.execIn(namespace, prober, "grep -c 'bytes from' "+probeLog)
	n, perr := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || perr != nil {
		h.t.Fatalf("counting the probe's replies in %s/%s: %v %v: %s", namespace, prober, err, perr, out)
	}
	return n
}

// TestCrossNodeSwitchBench measures, from inside a guest, how long a guest
// that migrates between two hosts is unreachable: a prober guest on B pings
// a mover every 20 ms while the mover goes to A and back, several times,
// live (host routing) and cold (VXLAN). Each figure is the longest time the
// prober waited between two replies, by its own clock: the migration's
// pause, the routes' switch on both hosts and the neighbours' caches all
// count. Figures only, no bound:
//
//	KAIRON_CROSSNODE_BENCH=1 KAIRON_BIN_DIR=$PWD/bin go test -count=1 -run TestCrossNodeSwitchBench -v ./test/e2e/
//
// KAIRON_CROSSNODE_BENCH_MOVES sets the moves per mode (default 4).
func TestCrossNodeSwitchBench(t *testing.T) {
	if os.Getenv("KAIRON_CROSSNODE_BENCH") == "" {
		t.Skip("set KAIRON_CROSSNODE_BENCH=1 to measure how long a migrated guest is unreachable")
	}
	moves := 4
	if n, err := strconv.Atoi(os.Getenv("KAIRON_CROSSNODE_BENCH_MOVES")); err == nil && n > 0 {
		moves = n
	}
	for _, c := range []struct{ mode, strategy string }{{"host", "live"}, {"vxlan", "live"}, {"vxlan", "cold"}} {
		t.Run(c.mode+"-"+c.strategy, func(t *testing.T) {
			env := testenv.Get(t)
			ns := env.Namespace(t)
			startController(t, env)
			h := startCrossNodeHosts(t, env, c.mode, ns)
			h.distinctSubnets(t)
			h.createOn(ns, "mover", h.names[1])
			h.createOn(ns, "prober", h.names[1])
			mover := h.addressOf(ns, "mover")
			h.addressOf(ns, "prober")
			h.startProbe(ns, "prober", mover)
			var gaps, quiet []string
			for i := range moves {
				// The probe's own silences with nothing moving, over the
				// next 150 echoes (3 s when the guest keeps time): what
				// the machine's load alone costs.
				from := h.replies(ns, "prober")
				testenv.Eventually(t, 2*time.Minute, "150 more replies before the move", func() (bool, string) {
					n := h.replies(ns, "prober")
					return n >= from+150, fmt.Sprint(n)
				})
				still := longestOutage(h.readProbe(ns, "prober")[from:])
				to := h.names[i%2]
				o := h.probeAcrossMove(ns, "prober", "mover", mover, fmt.Sprintf("move-%d", i), c.strategy, to)
				where := map[bool]string{true: "away from its subnet's node", false: "back to its subnet's node"}[i%2 == 0]
				t.Logf("%s %s move %d (%s): %s; before it, with nothing moving, %s", c.mode, c.strategy, i, where, o, still)
				gaps = append(gaps, o.gap.Round(time.Millisecond).String())
				quiet = append(quiet, still.gap.Round(time.Millisecond).String())
			}
			h.stopProbe(ns, "prober")
			t.Logf("%s routing, %s migrations: longest silences %s (with nothing moving: %s)", c.mode, c.strategy, strings.Join(gaps, " "), strings.Join(quiet, " "))
		})
	}
}

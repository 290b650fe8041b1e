package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/netlab"
)

// dial has the guest of namespace/machine open a TCP connection to
// address:port with its own nc and returns what it read (the outside's
// greeting servers answer "hi").
func (h *crossNodeHosts) dial(namespace, machine, address, port string) (string, error) {
	return h.execIn(namespace, machine, dialPath(address, port).cmd)
}

// mustDial waits until the guest of namespace/machine is greeted at
// address:port.
func (h *crossNodeHosts) mustDial(namespace, machine, address, port string) {
	h.t.Helper()
	testenv.Eventually(h.t, time.Minute, namespace+"/"+machine+" greeted at "+address+":"+port, func() (bool, string) {
		out, err := h.dial(namespace, machine, address, port)
		return strings.Contains(out, "hi\n"), fmt.Sprint(out, err)
	})
}

// blockedPath is a connection a guest must not complete: the shell command
// that tries it from the guest, and what its output holds if it did.
type blockedPath struct {
	what, cmd, answer string
}

// dialPath is a TCP connection to address:port whose server greets "hi".
func dialPath(address, port string) blockedPath {
	return blockedPath{what: "greeted at " + address + ":" + port, cmd: "nc -w 3 " + address + " " + port + " </dev/null", answer: "hi\n"}
}

// fetchPath is a fetch of the guest page at address (nc; busybox's wget
// is no use, as in egress_test.go).
func fetchPath(address string) blockedPath {
	return blockedPath{what: "fetched the page at " + address, cmd: `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 ` + address + " 8080", answer: "kairon guest"}
}

// mustNotReach checks, after positive controls on the same paths, that the
// guest of namespace/machine completes none of paths. They are tried side
// by side, in one exec: each that is dropped, as it should be, costs nc's
// whole timeout.
func (h *crossNodeHosts) mustNotReach(namespace, machine string, paths ...blockedPath) {
	h.t.Helper()
	var script strings.Builder
	for i, p := range paths {
		fmt.Fprintf(&script, "(%s) >/tmp/path.%d 2>&1 &\n", p.cmd, i)
	}
	script.WriteString("wait\n")
	for i := range paths {
		fmt.Fprintf(&script, "echo '=== path %d'; cat /tmp/path.%d\n", i, i)
	}
	out, err := h.execIn(namespace, machine, script.String())
	if err != nil {
		h.t.Fatalf("trying %d paths from %s/%s: %v: %s", len(paths), namespace, machine, err, out)
	}
	for i, p := range paths {
		_, rest, found := strings.Cut(out, fmt.Sprintf("=== path %d\n", i))
		if !found {
			h.t.Fatalf("no result for path %d (%s) from %s/%s: %q", i, p.what, namespace, machine, out)
		}
		got, _, _ := strings.Cut(rest, "=== path ")
		if strings.Contains(got, p.answer) {
			h.t.Errorf("%s/%s %s: %q", namespace, machine, p.what, got)
		}
	}
}

// outsideOf links each host to an outside of its own, as each real node
// has its uplink, with the same destinations and servers: pkg.test
// greeting on two ports, another host on one. Masquerading is off between
// the hosts, so each outside routes the cluster range back to its host.
func (h *crossNodeHosts) outsideOf() {
	h.t.Helper()
	for i := range h.netns {
		outside := netlab.Outside(h.t, h.netns[i], []string{pkgTest, otherHost}, "10.88.0.0/16")
		netlab.ServeGreeting(h.t, outside, pkgTest+":8050", "hi\n")
		netlab.ServeGreeting(h.t, outside, pkgTest+":8051", "hi\n")
		netlab.ServeGreeting(h.t, outside, otherHost+":8050", "hi\n")
	}
}

// TestCrossNodeEgress: one guest confined by MachineNetworkPolicies, on two
// hosts with host routing, is confined the same on either host. On A: the
// allowed destination and port answer, another destination and another
// port of the allowed one do not, and a guest of its own namespace on B
// is out of reach until a policy names its address (docs/guides/egress.md:
// a confined guest is denied the guest network unless a policy's CIDR lies
// in it); a guest of another namespace on B stays out of reach even when a
// policy names its address (the namespaces' separation is the baseline's,
// which no policy opens). The guest then moves live to B, where its
// policies are enforced before it runs, and everything holds the same,
// now on B's bridge; removing the policy that names the guests closes them
// again there.
func TestCrossNodeEgress(t *testing.T) {
	env := testenv.Get(t)
	teamA, teamB := env.Namespace(t), env.Namespace(t)
	startController(t, env)
	h := startCrossNodeHosts(t, env, "host", teamA)
	a, b := h.names[0], h.names[1]
	h.outsideOf()
	t.Cleanup(func() {
		if t.Failed() {
			for i, name := range h.names {
				t.Logf("egress table of %s:\n%s", name, nftIn(h.netns[i], "list", "table", "inet", "kairon_egress"))
			}
			t.Logf("policies:\n%s", kubectlQuiet(env, "-n", teamA, "get", "machinenetworkpolicies", "-o", "yaml"))
		}
	})

	h.distinctSubnets(t)
	confined := "confined"
	h.createOn(teamA, confined, a)
	h.createOn(teamA, "peer", b)
	h.createOn(teamB, "other", b)
	h.addressOf(teamA, confined)
	peer, other := h.addressOf(teamA, "peer"), h.addressOf(teamB, "other")
	t.Logf("%s/%s on %s; %s/peer %s and %s/other %s on %s", teamA, confined, a, teamA, peer, teamB, other, b)

	// Unconfined, every path works (but to another namespace).
	h.mustDial(teamA, confined, pkgTest, "8050")
	h.mustDial(teamA, confined, pkgTest, "8051")
	h.mustDial(teamA, confined, otherHost, "8050")
	h.mustFetch(teamA, confined, peer, "peer")
	if page, err := getInNetNS(h.netns[1], "http://"+other+":8080/"); !strings.Contains(page, "kairon guest other") {
		t.Fatalf("the guest of %s does not answer its node: %q %v", teamB, page, err)
	}
	h.mustNotFetch(teamA, confined, other)

	env.KubectlStdin(t, fmt.Sprintf(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachineNetworkPolicy
metadata: {name: pkg}
spec:
  machineName: %s
  egress: {allowCidrs: ["%s/32"], allowPorts: ["8050"]}
`, confined, pkgTest), "-n", teamA, "apply", "-f", "-")
	waitPolicyEnforced(t, env, teamA, "pkg", a, confined)
	// checkConfined asserts what the policy pkg alone allows: the peer
	// only if guests is in force too.
	checkConfined := func(where string, guests bool) {
		t.Helper()
		t.Logf("checking %s/%s on %s (a policy naming the guests: %v)", teamA, confined, where, guests)
		h.mustDial(teamA, confined, pkgTest, "8050")
		blocked := []blockedPath{dialPath(pkgTest, "8051"), dialPath(otherHost, "8050"), fetchPath(other)}
		if guests {
			h.mustFetch(teamA, confined, peer, "peer")
		} else {
			blocked = append(blocked, fetchPath(peer))
		}
		h.mustNotReach(teamA, confined, blocked...)
	}
	checkConfined(a, false)

	env.KubectlStdin(t, fmt.Sprintf(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachineNetworkPolicy
metadata: {name: guests}
spec:
  machineName: %s
  egress: {allowCidrs: ["%s/32", "%s/32"]}
`, confined, peer, other), "-n", teamA, "apply", "-f", "-")
	waitPolicyEnforced(t, env, teamA, "guests", a, confined)
	checkConfined(a, true)

	migrateTo(t, env, teamA, "to-b", confined, "live", b)
	waitPolicyEnforced(t, env, teamA, "pkg", b, confined)
	waitPolicyEnforced(t, env, teamA, "guests", b, confined)
	checkConfined(b, true)
	env.Kubectl(t, "-n", teamA, "delete", "machinenetworkpolicy", "guests")
	testenv.Eventually(t, time.Minute, "the policy guests to be lifted on "+b, func() (bool, string) {
		out := nftIn(h.netns[1], "list", "table", "inet", "kairon_egress")
		return !strings.Contains(out, peer), out
	})
	checkConfined(b, false)
}

// The guest's TLS client (busybox ssl_client) sends no signature_algorithms;
// the test's HTTPS servers accept it the way older servers did (SHA-1).
//
//go:debug tlssha1=1
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/netlab"
)

// The outside of TestEgressOnARealGuest: a resolver, pkg.test and another
// host, all in a namespace the test links to the nodes' namespace.
const (
	outsideResolver = "198.51.100.2:53"
	pkgTest         = "203.0.113.10"
	otherHost       = "203.0.113.20"
)

// restartEgressAgent runs a QEMU kairon-node whose guests share the bridge
// of ns with the other agents of the test (as kairon-local's), with the
// egress proxies on ports of its own, forwarding DNS to the outside's
// resolver, accepting live migrations on loopback.
func restartEgressAgent(t *testing.T, env *testenv.Env, name, state, ns string, index int) *agent {
	t.Helper()
	return startAgentWith(t, env, name, state, ns, 4, "2Gi",
		"--network-cidr", "10.88.0.0/16", "--address-pool", fmt.Sprintf("10.88.%d.0/24", 40+index),
		"--migration-listen", "127.0.0.1:0",
		"--egress-dns-port", fmt.Sprint(10153+2*index), "--egress-sni-port", fmt.Sprint(10154+2*index),
		"--egress-dns-upstream", outsideResolver,
		// Longer than the default 30 s: the steps between learning
		// pkg.test and killed-learned need the address still allowed,
		// and on a loaded machine they outlasted 10 s. The check after
		// "again" shows the flag applied (the default gives 35 s).
		"--egress-dns-min-ttl", "40s")
}

// TestEgressOnARealGuest claims a real guest under an egress policy and
// has it try, from its own shell, what the policy allows and what it does
// not; then SIGKILLs its agent and tries again while no agent runs, edits
// a policy through the restarted agent, lets a learned address expire,
// moves the guest live to another node (where kaironctl exec still
// reaches it), and deletes the claim: nothing of its enforcement may be
// left.
func TestEgressOnARealGuest(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	netNS := netns(t)
	outside := netlab.Outside(t, netNS, []string{pkgTest, otherHost}, "10.88.0.0/16")
	netlab.ServeDNS(t, outside, outsideResolver, 1, map[string]string{"pkg.test": pkgTest, "other.test": otherHost})
	netlab.ServeHTTP(t, outside, pkgTest+":443", "hi\n", "pkg.test")
	netlab.ServeHTTP(t, outside, pkgTest+":80", "hi\n")
	netlab.ServeGreeting(t, outside, pkgTest+":8050", "hi\n")
	netlab.ServeHTTP(t, outside, otherHost+":443", "hi\n", "other.test")
	netlab.ServeGreeting(t, outside, otherHost+":8050", "hi\n")

	// Not t.TempDir(): the VMs' unix sockets must fit in 108 bytes.
	state, err := os.MkdirTemp("", "kegr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	t.Cleanup(func() { killVMs(t, state) })
	first, second := ns+"-a", ns+"-b"
	startController(t, env)
	agents := map[string]*agent{first: restartEgressAgent(t, env, first, filepath.Join(state, "a"), netNS, 1)}
	deleteNodeAtEnd(t, env, first)
	deleteNodeAtEnd(t, env, second)
	t.Cleanup(func() {
		if t.Failed() {
			for name, a := range agents {
				out, _ := os.ReadFile(a.log)
				t.Logf("kairon-node %s log:\n%s", name, tail(string(out), 40))
			}
			t.Logf("objects:\n%s", kubectlQuiet(env, "-n", ns, "get", "machinepools,machineclaims,machines,machinenetworkpolicies,machinemigrations", "-o", "wide"))
			t.Logf("egress tables:\n%s", nftIn(netNS, "list", "table", "inet", "kairon_egress"))
		}
	})

	env.KubectlStdin(t, `apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachinePool
metadata: {name: sandboxes}
spec:
  replicas: 1
  template:
    spec: {cpu: 1, memory: 256Mi}
`, "-n", ns, "apply", "-f", "-")
	testenv.Eventually(t, 4*time.Minute, "a Running warm member", func() (bool, string) {
		out := jsonpathQuiet(env, testenv.Query{Namespace: ns, Resource: "machines", LabelSelector: kaironv1.LabelPoolState + "=" + kaironv1.PoolStateWarm}, "{.items[*].status.phase}")
		return strings.Contains(out, "Running"), out
	})
	env.KubectlStdin(t, `apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachineClaim
metadata: {name: job}
spec:
  poolName: sandboxes
  egress:
    allowFqdns: [pkg.test]
    allowPorts: ["443"]
    allowSNI: [pkg.test]
`, "-n", ns, "apply", "-f", "-")
	claim := &kaironv1.MachineClaim{}
	testenv.Eventually(t, 2*time.Minute, "claim job Bound", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "job"}, claim); err != nil {
			return false, err.Error()
		}
		return claim.Status.Phase == kaironv1.ClaimBound, fmt.Sprintf("%s %v", claim.Status.Phase, claim.Status.Conditions)
	})
	if c := meta.FindStatusCondition(claim.Status.Conditions, kaironv1.ConditionEgressEnforced.String()); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("claim Bound without EgressEnforced True: %v", claim.Status.Conditions)
	}
	machine := claim.Status.MachineName
	// A second policy of the Machine, plain TCP to pkg.test on 8050: the
	// Machine may do what either allows.
	env.KubectlStdin(t, fmt.Sprintf(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachineNetworkPolicy
metadata: {name: plain-8050}
spec:
  machineName: %s
  egress: {allowFqdns: [pkg.test], allowPorts: ["8050"]}
`, machine), "-n", ns, "apply", "-f", "-")
	waitPolicyEnforced(t, env, ns, "plain-8050", first, machine)

	con := testenv.DialConsole(t, filepath.Join(state, "a", "instances", ns+"_"+machine, "console.sock"))
	// count runs a command in the guest's shell and returns how many lines
	// of its output match the extended regular expression want.
	count := func(label, command, want string) string {
		t.Helper()
		return con.Expect(t, fmt.Sprintf("echo %s:$(%s 2>&1 | grep -cE '%s').", label, command, want),
			regexp.MustCompile(label+`:(\d+)\.`), time.Minute)[1]
	}
	expect := func(label, command, want, n string) {
		t.Helper()
		if got := count(label, command, want); got != n {
			t.Errorf("%s: `%s` gave %s lines matching %q, want %s", label, command, got, want, n)
		}
	}
	// expectTogether is expect for probes that run at the same time: each
	// denied one waits out its nc timeout (3 or 5 s, the proof that nothing
	// came back), and none of them changes what the others may reach.
	type probe struct{ label, command, want, n string }
	expectTogether := func(probes ...probe) {
		t.Helper()
		var all strings.Builder
		for _, p := range probes {
			fmt.Fprintf(&all, "(%s 2>&1 | grep -cE '%s' > /tmp/probe-%s) & ", p.command, p.want, p.label)
		}
		con.Expect(t, all.String()+"wait; echo probes:$((1+1)).", regexp.MustCompile(`probes:2\.`), time.Minute)
		for _, p := range probes {
			got := con.Expect(t, fmt.Sprintf("echo %s:$(cat /tmp/probe-%s).", p.label, p.label), regexp.MustCompile(p.label+`:(\d+)\.`), 30*time.Second)[1]
			if got != p.n {
				t.Errorf("%s: `%s` gave %s lines matching %q, want %s", p.label, p.command, got, p.want, p.n)
			}
		}
	}
	nc := func(addr, port string) string { return "nc -w 3 " + addr + " " + port + " </dev/null" }
	// HTTP and TLS go through nc, whose -w bounds each probe (busybox's
	// wget -T crashes: guest-image.md), TLS with busybox's ssl_client on
	// the connection nc opened, naming server sni.
	get := func(addr, port string) string {
		return `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 ` + addr + " " + port
	}
	tls := func(addr, sni string) string {
		return "nc -w 5 " + addr + ` 443 -e /bin/sh -c 'exec 3<&0; printf "GET / HTTP/1.0\r\n\r\n" | ssl_client -s 3 -n ` + sni + ` >&2'`
	}
	// The guest booted with the node's resolver in its resolv.conf; being
	// confined, its DNS goes to the node's proxy whatever address it asks.
	expect("resolv-conf", "cat /etc/resolv.conf", `^nameserver 198\.51\.100\.2$`, "1")

	expect("early", nc(pkgTest, "8050"), "^hi$", "0") // hard-coded, never resolved
	expect("resolve", "nslookup pkg.test", pkgTest, "1")
	expect("tls", tls(pkgTest, "pkg.test"), "^hi$", "1")
	expectTogether(
		probe{"wrong-sni", tls(pkgTest, "evil.test"), "^hi$", "0"},
		probe{"plain", nc(pkgTest, "8050"), "^hi$", "1"},
		probe{"port80", get(pkgTest, "80"), "^hi$", "0"},
		probe{"other", tls(otherHost, "other.test"), "^hi$", "0"},
		probe{"refused", "nslookup other.test", otherHost, "0"})
	testenv.Eventually(t, time.Minute, "a Warning event naming the first dropped destination", func() (bool, string) {
		out := jsonpathQuiet(env, testenv.Query{Namespace: ns, Resource: "events", FieldSelector: "involvedObject.name=" + machine + ",reason=EgressDenied"}, "{.items[*].message}")
		return strings.Contains(out, "dropped tcp "+pkgTest+":8050 (ip: no policy allows the destination)"), out
	})

	// An unconfined guest (the pool's new warm member) resolves with the
	// same resolv.conf, straight through the node to the resolver, and
	// its tools reach a host by name.
	var member string
	testenv.Eventually(t, 4*time.Minute, "a Running warm member in place of the claimed one", func() (bool, string) {
		var warm kaironv1.MachineList
		if err := env.Client.List(ctx, &warm, client.InNamespace(ns), client.MatchingLabels{kaironv1.LabelPoolState: kaironv1.PoolStateWarm}); err != nil {
			return false, err.Error()
		}
		for _, m := range warm.Items {
			if m.Status.Phase == kaironv1.MachineRunning {
				member = m.Name
				return true, ""
			}
		}
		return false, fmt.Sprint(len(warm.Items), " warm, none Running")
	})
	resolved, err := exec.Command(filepath.Join(env.BinDir, "kaironctl"), "--kubeconfig", env.Kubeconfig, "-n", ns, "exec", member, "--", "nslookup", "pkg.test").CombinedOutput()
	if err != nil || !strings.Contains(string(resolved), pkgTest) {
		t.Errorf("nslookup pkg.test in the unconfined guest %s: %v: %s", member, err, resolved)
	}
	page, err := exec.Command(filepath.Join(env.BinDir, "kaironctl"), "--kubeconfig", env.Kubeconfig, "-n", ns, "exec", "--timeout", "30s", member, "--", "wget", "-qO-", "http://pkg.test/").CombinedOutput()
	if err != nil || string(page) != "hi\n" {
		t.Errorf("wget http://pkg.test/ in the unconfined guest %s: %v: %q", member, err, page)
	}

	// No agent: the rules stay in the kernel.
	agents[first].kill()
	expectTogether(
		probe{"killed-other", tls(otherHost, "other.test"), "^hi$", "0"},
		probe{"killed-other-plain", nc(otherHost, "8050"), "^hi$", "0"},
		probe{"killed-learned", nc(pkgTest, "8050"), "^hi$", "1"})

	// The restarted agent adopts the guest and applies an edit.
	agents[first] = restartEgressAgent(t, env, first, filepath.Join(state, "a"), netNS, 1)
	waitNodeReady(t, env, first)
	env.Kubectl(t, "-n", ns, "patch", "machinenetworkpolicy", "plain-8050", "--type=merge", "-p",
		`{"spec":{"egress":{"allowCidrs":["`+otherHost+`/32"]}}}`)
	waitPolicyEnforced(t, env, ns, "plain-8050", first, machine)
	expectTogether(
		probe{"edited", nc(otherHost, "8050"), "^hi$", "1"},
		probe{"edited-443", tls(otherHost, "other.test"), "^hi$", "0"})

	// The learned address of pkg.test expires (TTL 1 s, raised to the
	// agents' --egress-dns-min-ttl of 40 s, plus 5 s of grace): closed again
	// until the guest resolves again.
	testenv.Eventually(t, 2*time.Minute, "the learned address of pkg.test to expire", func() (bool, string) {
		out := nftIn(netNS, "list", "table", "inet", "kairon_egress")
		return !strings.Contains(out, pkgTest+" timeout") && !strings.Contains(out, pkgTest+" expires"), out
	})
	expect("expired", nc(pkgTest, "8050"), "^hi$", "0")
	expect("again", "nslookup pkg.test", pkgTest, "1")
	if out := nftIn(netNS, "list", "table", "inet", "kairon_egress"); !strings.Contains(out, pkgTest+" timeout 45s") {
		t.Errorf("the address learned again is not kept for --egress-dns-min-ttl 40s plus the grace (timeout 45s):\n%s", out)
	}
	expect("relearned", nc(pkgTest, "8050"), "^hi$", "1")

	// The guest agent's channel, before the move and after it (kaironctl
	// exec reaches the agent of whichever node runs the Machine).
	kaironctlExec := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(env.BinDir, "kaironctl"), append([]string{"--kubeconfig", env.Kubeconfig, "-n", ns, "exec", machine, "--"}, args...)...).CombinedOutput()
		if err != nil {
			t.Errorf("kaironctl exec %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	kaironctlExec("sh", "-c", "echo written-before-the-move > /tmp/marker")

	// Live to the other node: confined there before it runs there.
	agents[second] = restartEgressAgent(t, env, second, filepath.Join(state, "b"), netNS, 2)
	waitNodeReady(t, env, second)
	env.KubectlStdin(t, fmt.Sprintf(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachineMigration
metadata: {name: follow}
spec: {machineName: %s, strategy: live, targetNode: %s}
`, machine, second), "-n", ns, "apply", "-f", "-")
	testenv.Eventually(t, 3*time.Minute, "migration follow to end", func() (bool, string) {
		out := jsonpathQuiet(env, testenv.Query{Namespace: ns, Resource: "machinemigration", Name: "follow"}, "{.status.phase} {.status.reason} {.status.message}")
		if strings.HasPrefix(out, "Failed") {
			t.Fatalf("migration failed: %s", out)
		}
		return strings.HasPrefix(out, "Succeeded"), out
	})
	waitPolicyEnforced(t, env, ns, "plain-8050", second, machine)
	if got := kaironctlExec("cat", "/tmp/marker"); got != "written-before-the-move\n" {
		t.Errorf("kaironctl exec after the live migration: %q", got)
	}
	con = testenv.DialConsole(t, filepath.Join(state, "b", "instances", ns+"_"+machine, "console.sock"))
	// A forwarded connection first: the guest still has the gateway's
	// address it learned on the other node (the bridge's own, which taps
	// coming and going do not move).
	expect("moved-cidr", nc(otherHost, "8050"), "^hi$", "1")
	expectTogether(
		probe{"moved-other", tls(otherHost, "other.test"), "^hi$", "0"},
		probe{"moved-unlearned", tls(pkgTest, "pkg.test"), "^hi$", "0"})
	expect("moved-resolve", "nslookup pkg.test", pkgTest, "1")
	expect("moved-tls", tls(pkgTest, "pkg.test"), "^hi$", "1")
	expect("moved-refused", "nslookup other.test", otherHost, "0")

	// Releasing the claim deletes its policy, then its Machine; with the
	// other policy gone too, nothing of the guest's enforcement is left.
	env.Kubectl(t, "-n", ns, "delete", "machinenetworkpolicy", "plain-8050")
	env.Kubectl(t, "-n", ns, "delete", "machineclaim", "job", "--wait=true", "--timeout=2m")
	testenv.Eventually(t, 2*time.Minute, "machine "+machine+" gone", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: machine}, &kaironv1.Machine{})
		return err != nil, fmt.Sprint(err)
	})
	testenv.Eventually(t, time.Minute, "no egress object of the released Machine", func() (bool, string) {
		out := nftIn(netNS, "list", "table", "inet", "kairon_egress") + nftIn(netNS, "list", "table", "bridge", "kairon_egress")
		for _, left := range []string{"chain e_", "chain s_", "set l4_", "set dd_", "counter d_", ": goto"} {
			if strings.Contains(out, left) {
				return false, out
			}
		}
		return true, ""
	})
}

func nftIn(netNS string, args ...string) string {
	out, err := exec.Command("ip", append([]string{"netns", "exec", netNS, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}

// waitPolicyEnforced waits until node reports policy enforced for machine
// at the policy's current generation.
func waitPolicyEnforced(t *testing.T, env *testenv.Env, ns, policy, node, machine string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, "policy "+policy+" enforced on "+node, func() (bool, string) {
		p := &kaironv1.MachineNetworkPolicy{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: policy}, p); err != nil {
			return false, err.Error()
		}
		for _, n := range p.Status.Nodes {
			if n.Node == node && n.ObservedGeneration == p.Generation && n.Error == "" && strings.Contains(" "+strings.Join(n.Machines, " ")+" ", " "+machine+" ") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("generation %d, status %+v", p.Generation, p.Status.Nodes)
	})
}

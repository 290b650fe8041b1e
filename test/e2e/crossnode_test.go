package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// The node annotation and the Lease label of guest networking across
// nodes (internal/node/crossnode_subnet.go), as a user reads them.
const (
	guestCIDRAnnotation = "kairon.zyvor.dev/guest-cidr"
	guestSubnetLabel    = "kairon.zyvor.dev/guest-subnet"
	crossNodeProto      = "75"
)

// crossNodeHosts are two "hosts" as network namespaces, each running one
// kairon-node of the test's control plane with its bridge, taps and VMs
// there, and the namespaces' addresses on the link between them.
type crossNodeHosts struct {
	t      *testing.T
	env    *testenv.Env
	names  [2]string
	netns  [2]string
	addrs  [2]string
	agents [2]*agent
}

// linkHosts joins two new namespaces: by a veth pair (host), or through a
// third namespace routing between two links (vxlan: the hosts share no
// link, as nodes in different racks).
func linkHosts(t *testing.T, mode string) (hosts, addrs [2]string) {
	t.Helper()
	hosts = [2]string{netns(t), netns(t)}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	if mode == "host" {
		addrs = [2]string{"192.168.77.1", "192.168.77.2"}
		ip("-n", hosts[0], "link", "add", "up0", "type", "veth", "peer", "name", "up0", "netns", hosts[1])
		for i := range hosts {
			ip("-n", hosts[i], "addr", "add", addrs[i]+"/24", "dev", "up0")
			ip("-n", hosts[i], "link", "set", "up0", "up")
		}
		return hosts, addrs
	}
	router := netns(t)
	if out, err := exec.Command("ip", "netns", "exec", router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward").CombinedOutput(); err != nil {
		t.Fatalf("forwarding in the router: %v: %s", err, out)
	}
	addrs = [2]string{"192.168.71.2", "192.168.72.2"}
	for i, side := range []string{"ra", "rb"} {
		net := []string{"192.168.71", "192.168.72"}[i]
		other := []string{"192.168.72.0/24", "192.168.71.0/24"}[i]
		ip("-n", hosts[i], "link", "add", "up0", "type", "veth", "peer", "name", side, "netns", router)
		ip("-n", hosts[i], "addr", "add", addrs[i]+"/24", "dev", "up0")
		ip("-n", hosts[i], "link", "set", "up0", "up")
		ip("-n", hosts[i], "route", "add", other, "via", net+".1")
		ip("-n", router, "addr", "add", net+".1/24", "dev", side)
		ip("-n", router, "link", "set", side, "up")
	}
	return hosts, addrs
}

func startCrossNodeHosts(t *testing.T, env *testenv.Env, mode, prefix string) *crossNodeHosts {
	t.Helper()
	h := &crossNodeHosts{t: t, env: env, names: [2]string{prefix + "-a", prefix + "-b"}}
	h.netns, h.addrs = linkHosts(t, mode)
	// Not t.TempDir(): the VMs' unix sockets must fit in 108 bytes.
	state, err := os.MkdirTemp("", "kxn-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	t.Cleanup(func() { killVMs(t, state) })
	for i, name := range h.names {
		h.agents[i] = startAgentWith(t, env, name, filepath.Join(state, name[len(name)-1:]), h.netns[i], 4, "2Gi",
			"--cluster-guest-cidr", "10.88.0.0/16", "--node-guest-prefix", "24",
			"--cross-node-routing", mode, "--cross-node-address", h.addrs[i],
			"--egress-masquerade", "none", "--migration-listen", "127.0.0.1:0")
		deleteNodeAtEnd(t, env, name)
	}
	for _, name := range h.names {
		waitNodeReady(t, env, name)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, a := range h.agents {
				out, _ := os.ReadFile(a.log)
				t.Logf("kairon-node %s log:\n%s", h.names[i], tail(string(out), 40))
				t.Logf("routes of %s:\n%s", h.names[i], ipIn(h.netns[i], "-4", "route"))
			}
		}
	})
	return h
}

// ipIn runs ip in a namespace and returns its output (errors included).
func ipIn(netns string, args ...string) string {
	out, _ := exec.Command("ip", append([]string{"-n", netns}, args...)...).CombinedOutput()
	return string(out)
}

// createOn creates namespace/name on node; guests created one after the
// other boot side by side.
func (h *crossNodeHosts) createOn(namespace, name, node string) {
	h.t.Helper()
	h.env.KubectlStdin(h.t, fmt.Sprintf("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata:\n  name: %s\nspec: {nodeName: %s, cpu: 1, memory: 256Mi}\n", name, node),
		"-n", namespace, "apply", "-f", "-")
}

// addressOf returns the address of namespace/name once it runs.
func (h *crossNodeHosts) addressOf(namespace, name string) string {
	h.t.Helper()
	// Longer than waitPhase's bound: these tests boot their guests side by
	// side on two agents, on a machine other tests load too.
	m := &kaironv1.Machine{}
	testenv.Eventually(h.t, 8*time.Minute, namespace+"/"+name+" Running", func() (bool, string) {
		if err := h.env.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, m); err != nil {
			return false, err.Error()
		}
		if m.Status.Phase == kaironv1.MachineFailed {
			h.t.Fatalf("%s/%s failed: %s", namespace, name, m.Status.Message)
		}
		return m.Status.Phase == kaironv1.MachineRunning, fmt.Sprintf("%s: %s", m.Status.Phase, m.Status.Message)
	})
	if len(m.Status.Addresses) == 0 {
		h.t.Fatalf("%s/%s runs without an address", namespace, name)
	}
	return m.Status.Addresses[0].Address
}

// fetchFrom has the guest of namespace/machine fetch the guest page at
// address, with its own nc (through the guest agent; the guest's busybox
// wget is no use, as in egress_test.go).
func (h *crossNodeHosts) fetchFrom(namespace, machine, address string) (string, error) {
	return h.execIn(namespace, machine, fetchPath(address).cmd)
}

// mustFetch waits until the guest of namespace/machine gets the page of
// the guest named target at address.
func (h *crossNodeHosts) mustFetch(namespace, machine, address, target string) {
	h.t.Helper()
	testenv.Eventually(h.t, 2*time.Minute, namespace+"/"+machine+" fetching the page of "+target+" at "+address, func() (bool, string) {
		out, err := h.fetchFrom(namespace, machine, address)
		return strings.Contains(out, "kairon guest "+target+"\n"), fmt.Sprint(out, err)
	})
}

// mustNotFetch checks, after a positive control on the same path, that
// the guest cannot fetch from address: nc's own timeout is the window.
func (h *crossNodeHosts) mustNotFetch(namespace, machine, address string) {
	h.t.Helper()
	h.mustNotReach(namespace, machine, fetchPath(address))
}

// migrateTo moves machine to node with a MachineMigration named name and
// waits until it Succeeded; a Failed one fails the test.
func migrateTo(t *testing.T, env *testenv.Env, ns, name, machine, strategy, node string) {
	t.Helper()
	env.KubectlStdin(t, fmt.Sprintf("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: MachineMigration\nmetadata: {name: %s}\nspec: {machineName: %s, strategy: %s, targetNode: %s}\n",
		name, machine, strategy, node), "-n", ns, "apply", "-f", "-")
	testenv.Eventually(t, 3*time.Minute, "the "+strategy+" migration to end", func() (bool, string) {
		out := jsonpathQuiet(env, testenv.Query{Namespace: ns, Resource: "machinemigration", Name: name}, "{.status.phase} {.status.reason} {.status.message}")
		if strings.HasPrefix(out, "Failed") {
			t.Fatalf("migration %s failed: %s", name, out)
		}
		return strings.HasPrefix(out, "Succeeded"), out
	})
}

// distinctSubnets returns the guest subnets the two hosts claimed, and
// fails the test unless each has one of its own.
func (h *crossNodeHosts) distinctSubnets(t *testing.T) (string, string) {
	t.Helper()
	a, b := h.subnetOf(h.names[0]), h.subnetOf(h.names[1])
	if a == "" || b == "" || a == b {
		t.Fatalf("guest subnets: %s has %q, %s has %q; want two different ones", h.names[0], a, h.names[1], b)
	}
	return a, b
}

// subnetOf is a Node's guest subnet annotation.
func (h *crossNodeHosts) subnetOf(name string) string {
	h.t.Helper()
	node := &corev1.Node{}
	if err := h.env.Client.Get(context.Background(), client.ObjectKey{Name: name}, node); err != nil {
		h.t.Fatal(err)
	}
	return node.Annotations[guestCIDRAnnotation]
}

// stop ends agent i as a DaemonSet rollout or Ctrl-C would (SIGTERM) and
// waits for it to exit.
func (h *crossNodeHosts) stop(i int) {
	h.t.Helper()
	a := h.agents[i]
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		h.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		h.t.Fatalf("kairon-node %s did not stop within 2 minutes of SIGTERM", h.names[i])
	}
}

// leftovers is what of guest routing across nodes is still in a host's
// namespace: routes tagged by the agent and the VXLAN device.
func leftovers(netns string) string {
	left := strings.TrimSpace(ipIn(netns, "-4", "route", "show", "proto", crossNodeProto))
	if out := ipIn(netns, "link", "show", "dev", "kairon-vx"); !strings.Contains(out, "does not exist") {
		left += "\n" + out
	}
	return strings.TrimSpace(left)
}

// TestCrossNodeHostRouting: two hosts on one link, routes to each other's
// guest subnets. A guest reaches a guest of its namespace on the other
// host and not one of another namespace; a guest moved live from B to A
// answers at its address from a third guest, on B; nothing is left when
// the Machines and the nodes go away.
func TestCrossNodeHostRouting(t *testing.T) {
	env := testenv.Get(t)
	teamA, teamB := env.Namespace(t), env.Namespace(t)
	startController(t, env)
	h := startCrossNodeHosts(t, env, "host", teamA)
	a, b := h.names[0], h.names[1]

	subnetA, subnetB := h.distinctSubnets(t)
	h.createOn(teamA, "one", a)
	h.createOn(teamA, "mover", b)
	h.createOn(teamA, "third", b)
	h.createOn(teamB, "other", b)
	one, mover, third, other := h.addressOf(teamA, "one"), h.addressOf(teamA, "mover"), h.addressOf(teamA, "third"), h.addressOf(teamB, "other")
	t.Logf("subnets %s %s; one %s, mover %s, third %s, other (%s) %s", subnetA, subnetB, one, mover, third, teamB, other)

	h.mustFetch(teamA, "one", mover, "mover")
	h.mustFetch(teamA, "mover", one, "one")
	// The other namespace's guest answers its node, and not a guest of
	// another namespace on the other host.
	if page, err := getInNetNS(h.netns[1], "http://"+other+":8080/"); !strings.Contains(page, "kairon guest other") {
		t.Fatalf("the guest of %s does not answer its node: %q %v", teamB, page, err)
	}
	h.mustNotFetch(teamA, "one", other)
	h.mustNotFetch(teamB, "other", one)

	// The third guest pings the mover from its own shell across the move,
	// as a guest that talked to it on B's bridge: the mover answers it
	// again from A, though it had the third's own MAC cached, which is no
	// port of A's bridge. The mover keeps its entries for 10 minutes, so
	// that it is A's announcement, not the entry's expiry, that lets its
	// answers through.
	if out, err := h.execIn(teamA, "mover", "echo 600000 >/proc/sys/net/ipv4/neigh/eth0/base_reachable_time_ms"); err != nil {
		t.Fatalf("the mover's neighbour timeout: %v: %s", err, out)
	}
	h.startProbe(teamA, "third", mover)
	testenv.Eventually(t, time.Minute, "the mover's entry for the third guest confirmed (REACHABLE)", func() (bool, string) {
		neigh, err := h.execIn(teamA, "mover", "ip neigh show "+third)
		return strings.Contains(neigh, "REACHABLE"), fmt.Sprint(neigh, err)
	})
	outage := h.probeAcrossMove(teamA, "third", "mover", mover, "move", "live", a)
	// A measure, not a bound (TestCrossNodeSwitchBench repeats it).
	t.Logf("the third guest, on %s, saw the mover moving live to %s as %s", b, a, outage)
	h.stopProbe(teamA, "third")
	h.mustFetch(teamA, "third", mover, "mover")
	h.mustFetch(teamA, "one", mover, "mover")
	h.mustNotFetch(teamB, "other", mover)
	if routes := ipIn(h.netns[1], "-4", "route", "show", mover); !strings.Contains(routes, "via "+h.addrs[0]) {
		t.Errorf("%s has no host route for the moved guest %s via %s:\n%s", b, mover, a, routes)
	}

	for _, key := range []client.ObjectKey{{Namespace: teamA, Name: "one"}, {Namespace: teamA, Name: "mover"}, {Namespace: teamA, Name: "third"}, {Namespace: teamB, Name: "other"}} {
		env.Kubectl(t, "-n", key.Namespace, "delete", "machine", key.Name, "--wait=true", "--timeout=2m")
	}
	testenv.Eventually(t, time.Minute, "no host route for the deleted moved guest", func() (bool, string) {
		out := ipIn(h.netns[0], "-4", "route", "show", "proto", crossNodeProto) + ipIn(h.netns[1], "-4", "route", "show", "proto", crossNodeProto)
		return !strings.Contains(out, mover+" "), out
	})
	h.expectCleanExit(subnetA, subnetB)
}

// expectCleanExit stops B's agent, deletes B's Node (A then drops its route
// to B's subnet), stops A's agent and deletes A's Node: no route or device
// of guest routing is left in either host, and the subnet claims go with
// the Nodes.
func (h *crossNodeHosts) expectCleanExit(subnetA, subnetB string) {
	t, env := h.t, h.env
	ctx := context.Background()
	h.stop(1)
	if left := leftovers(h.netns[1]); left != "" {
		t.Errorf("%s stopped with no VM left, but left behind:\n%s", h.names[1], left)
	}
	if err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.names[1]}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, h.names[0]+" dropping its route to the deleted node's subnet "+subnetB, func() (bool, string) {
		out := ipIn(h.netns[0], "-4", "route", "show", "proto", crossNodeProto)
		return !strings.Contains(out, subnetB), out
	})
	h.stop(0)
	if left := leftovers(h.netns[0]); left != "" {
		t.Errorf("%s stopped with no VM left, but left behind:\n%s", h.names[0], left)
	}
	if err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.names[0]}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "the subnet claims of the deleted nodes to go", func() (bool, string) {
		var leases coordinationv1.LeaseList
		if err := env.Client.List(ctx, &leases, client.MatchingLabels{guestSubnetLabel: "true"}); err != nil {
			return false, err.Error()
		}
		var held []string
		for _, l := range leases.Items {
			if holder := l.Spec.HolderIdentity; holder != nil && (*holder == h.names[0] || *holder == h.names[1]) {
				held = append(held, l.Name+" "+*holder)
			}
		}
		return len(held) == 0, strings.Join(held, ", ")
	})
}

// TestCrossNodeVXLAN: two hosts that reach each other only through a
// router; VXLAN tunnels carry the guests' traffic. A guest reaches a guest
// of its namespace on the other host and not one of another namespace; a
// guest moved cold to the other host keeps its address and is reached
// there; nothing is left when the Machines and the nodes go away.
func TestCrossNodeVXLAN(t *testing.T) {
	env := testenv.Get(t)
	teamA, teamB := env.Namespace(t), env.Namespace(t)
	startController(t, env)
	h := startCrossNodeHosts(t, env, "vxlan", teamA)
	a, b := h.names[0], h.names[1]
	subnetA, subnetB := h.distinctSubnets(t)
	h.createOn(teamA, "one", a)
	h.createOn(teamA, "two", b)
	h.createOn(teamB, "other", b)
	one, two, other := h.addressOf(teamA, "one"), h.addressOf(teamA, "two"), h.addressOf(teamB, "other")

	h.mustFetch(teamA, "one", two, "two")
	h.mustFetch(teamA, "two", one, "one")
	if page, err := getInNetNS(h.netns[1], "http://"+other+":8080/"); !strings.Contains(page, "kairon guest other") {
		t.Fatalf("the guest of %s does not answer its node: %q %v", teamB, page, err)
	}
	h.mustNotFetch(teamA, "one", other)
	if routes := ipIn(h.netns[0], "-4", "route", "show", subnetB); !strings.Contains(routes, "dev kairon-vx") {
		t.Errorf("%s routes %s not through the tunnel:\n%s", a, subnetB, routes)
	}

	// A cold migration between the hosts: B saves the guest, A fetches the
	// state from B's agent and restores it; the guest keeps its address,
	// now routed to A, and the guest on A reaches it there.
	// The guest on A pings it meanwhile: the figure is the cold
	// migration's whole downtime as a guest of the cluster sees it.
	h.startProbe(teamA, "one", two)
	outage := h.probeAcrossMove(teamA, "one", "two", two, "cold", "cold", a)
	t.Logf("the guest on %s saw the other one moving cold from %s to %s as %s", a, b, a, outage)
	h.stopProbe(teamA, "one")
	h.mustFetch(teamA, "one", two, "two")
	h.mustNotFetch(teamB, "other", two)

	for _, key := range []client.ObjectKey{{Namespace: teamA, Name: "one"}, {Namespace: teamA, Name: "two"}, {Namespace: teamB, Name: "other"}} {
		env.Kubectl(t, "-n", key.Namespace, "delete", "machine", key.Name, "--wait=true", "--timeout=2m")
	}
	h.expectCleanExit(subnetA, subnetB)
}

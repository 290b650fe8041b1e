package node

import (
	"context"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node/network"
)

func TestCrossNodeViewFromNodesAndMachines(t *testing.T) {
	subnets, err := network.NewGuestSubnets(netip.MustParsePrefix("10.88.0.0/16"), 24)
	if err != nil {
		t.Fatal(err)
	}
	node := func(name, cidr, crossAddress, internalIP string) corev1.Node {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
		if cidr != "" {
			n.Annotations[AnnotationGuestCIDR] = cidr
		}
		if crossAddress != "" {
			n.Annotations[AnnotationCrossNodeAddress] = crossAddress
		}
		if internalIP != "" {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: internalIP}}
		}
		return n
	}
	machine := func(namespace, name, nodeName, address string) kaironv1.Machine {
		m := kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
		m.Spec.NodeName = nodeName
		if address != "" {
			m.Status.Addresses = []kaironv1.MachineAddress{{Type: "InternalIP", Address: address}}
		}
		return m
	}
	machines := []kaironv1.Machine{
		machine("team-a", "one", "a", "10.88.1.2"),
		machine("team-a", "two", "b", "10.88.2.2"),
		machine("team-b", "three", "b", "10.88.2.3"),
		machine("team-a", "moved", "a", "10.88.2.9"), // b's subnet, running on a
		machine("team-b", "pending", "", ""),
		machine("team-b", "outside", "c", "192.0.2.7"),
		machine("team-a", "on-g", "g", "10.88.1.9"), // g's routes are not believed, nor its moved guests
	}
	view := buildCrossNodeView(subnets,
		[]corev1.Node{
			node("a", "10.88.1.0/24", "", "192.168.1.1"),
			node("b", "10.88.2.0/24", "172.16.0.2", "192.168.1.2"), // the annotation wins
			node("c", "", "", "192.168.1.3"),                       // no subnet: no peer
			node("d", "10.88.0.0/24", "", "192.168.1.4"),           // the gateway's: not a node subnet
			node("e", "10.99.1.0/24", "", "192.168.1.5"),           // outside the range
			node("f", "10.88.6.0/24", "", ""),                      // nowhere to send to
			node("g", "10.88.7.0/24", "", "192.168.1.7"),           // its claim is not confirmed
		},
		machines,
		func(node *corev1.Node, _ netip.Prefix) bool { return node.Name != "g" })
	wantPeers := []network.Peer{
		{Node: "a", Subnet: netip.MustParsePrefix("10.88.1.0/24"), Address: netip.MustParseAddr("192.168.1.1")},
		{Node: "b", Subnet: netip.MustParsePrefix("10.88.2.0/24"), Address: netip.MustParseAddr("172.16.0.2")},
	}
	if !reflect.DeepEqual(view.peers, wantPeers) {
		t.Errorf("peers = %v, want %v", view.peers, wantPeers)
	}
	wantMoved := []network.MovedGuest{{Address: netip.MustParseAddr("10.88.2.9"), Node: "a"}}
	if !reflect.DeepEqual(view.moved, wantMoved) {
		t.Errorf("moved = %v, want %v", view.moved, wantMoved)
	}
	wantNamespaces := map[string][]netip.Addr{
		"team-a": {netip.MustParseAddr("10.88.1.2"), netip.MustParseAddr("10.88.2.2"), netip.MustParseAddr("10.88.2.9"), netip.MustParseAddr("10.88.1.9")},
		"team-b": {netip.MustParseAddr("10.88.2.3")},
	}
	inUse, byNamespace := guestAddressesOf(subnets.Cluster, machines)
	if !reflect.DeepEqual(byNamespace, wantNamespaces) {
		t.Errorf("byNamespace = %v, want %v", byNamespace, wantNamespaces)
	}
	c := &guestAddresses{inUse: inUse}
	if !c.taken("team-b_new", netip.MustParseAddr("10.88.2.9")) {
		t.Error("the moved guest's address is free for another Machine")
	}
	if c.taken("team-a_moved", netip.MustParseAddr("10.88.2.9")) {
		t.Error("the moved guest's address is taken from itself")
	}
}

func TestArrivalsAreAnnouncedTheirFormerNeighbours(t *testing.T) {
	cluster := netip.MustParsePrefix("10.88.0.0/16")
	machine := func(namespace, name, nodeName string, addresses ...string) kaironv1.Machine {
		m := kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
		m.Spec.NodeName = nodeName
		for _, a := range addresses {
			m.Status.Addresses = append(m.Status.Addresses, kaironv1.MachineAddress{Type: "InternalIP", Address: a})
		}
		return m
	}
	before := []kaironv1.Machine{
		machine("team-a", "mover", "b", "10.88.2.2"),
		machine("team-a", "stays", "b", "10.88.2.3"),
		machine("team-a", "elsewhere", "c", "10.88.3.2"),
		machine("team-b", "other", "b", "10.88.2.4"),
		machine("team-a", "pending", ""),
	}
	addrs, last := arrivals("a", nil, before, cluster)
	if len(addrs) != 0 {
		t.Errorf("first look: announced %v; nothing arrived yet", addrs)
	}
	if want := map[string]string{"team-a_mover": "b", "team-a_stays": "b", "team-a_elsewhere": "c", "team-b_other": "b"}; !reflect.DeepEqual(last, want) {
		t.Errorf("nodes = %v, want %v", last, want)
	}
	after := []kaironv1.Machine{
		machine("team-a", "mover", "a", "10.88.2.2"),
		machine("team-a", "stays", "b", "10.88.2.3", "192.0.2.9"), // outside the range: not announced
		machine("team-a", "elsewhere", "c", "10.88.3.2"),          // never its neighbour
		machine("team-b", "other", "b", "10.88.2.4"),              // another namespace
		machine("team-a", "pending", "a"),                         // new, not arrived
	}
	addrs, _ = arrivals("a", last, after, cluster)
	if want := []netip.Addr{netip.MustParseAddr("10.88.2.3")}; !reflect.DeepEqual(addrs, want) {
		t.Errorf("arrival from b: announced %v, want %v", addrs, want)
	}
	// Elsewhere, no arrival is this node's business.
	if addrs, _ := arrivals("c", last, after, cluster); len(addrs) != 0 {
		t.Errorf("on c: announced %v for a Machine that arrived on a", addrs)
	}
}

// Once the teardown at stop has run, a sync still queued (the manager
// stops the controller and the teardown at once) changes nothing: this
// agent has no client and no routes, so a sync that went on would panic.
func TestCrossNodeSyncAfterTheStopChangesNothing(t *testing.T) {
	a := &Agent{crossNode: &crossNode{}}
	stopped, stop := context.WithCancel(context.Background())
	stop()
	if err := a.removeCrossNodeRoutesAtStop(stopped); err != nil {
		t.Fatal(err)
	}
	res, err := a.syncCrossNode(context.Background(), reconcile.Request{})
	if err != nil || res.RequeueAfter != 0 {
		t.Errorf("sync after the stop: %+v, %v; want nothing done and no requeue", res, err)
	}
}

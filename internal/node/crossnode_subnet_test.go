package node

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

// Agents racing for subnets of one range each get their own; a restarted
// agent keeps its subnet; a full range is refused by name; a subnet comes
// free only when its Node is deleted (the garbage collector deletes the
// claim with it).
func TestGuestSubnetClaims(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	// A /21 in /24s: seven subnets (the gateway's is no node's).
	subnets, err := network.NewGuestSubnets(netip.MustParsePrefix("10.123.8.0/21"), 24)
	if err != nil {
		t.Fatal(err)
	}
	prefix := env.Namespace(t)
	agentFor := func(i int) *Agent {
		vms, err := sim.New(sim.Options{StateDir: filepath.Join(t.TempDir(), "instances")})
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("%s-%d", prefix, i)
		t.Cleanup(func() { _ = env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}) })
		return &Agent{opts: Options{NodeName: name, Register: true, Backend: vms, Network: &NetworkOptions{}}}
	}
	agents := make([]*Agent, 7)
	got := make([]netip.Prefix, len(agents))
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for i := range agents {
		agents[i] = agentFor(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = agents[i].claimGuestSubnet(ctx, env.Config, subnets)
		}()
	}
	wg.Wait()
	seen := map[netip.Prefix]int{}
	for i, subnet := range got {
		if errs[i] != nil {
			t.Fatalf("agent %d: %v", i, errs[i])
		}
		if !subnets.Valid(subnet) {
			t.Errorf("agent %d got %s, not a node subnet of %s", i, subnet, subnets.Cluster)
		}
		if j, ok := seen[subnet]; ok {
			t.Errorf("agents %d and %d both got %s", j, i, subnet)
		}
		seen[subnet] = i
		node := &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: agents[i].opts.NodeName}, node); err != nil {
			t.Fatal(err)
		}
		if node.Annotations[AnnotationGuestCIDR] != subnet.String() {
			t.Errorf("node %s records %q, want %s", node.Name, node.Annotations[AnnotationGuestCIDR], subnet)
		}
	}

	again, err := agents[3].claimGuestSubnet(ctx, env.Config, subnets)
	if err != nil || again != got[3] {
		t.Errorf("restarted agent 3 got %v, %v; want its %s", again, err, got[3])
	}
	late := agentFor(7)
	if _, err := late.claimGuestSubnet(ctx, env.Config, subnets); err == nil {
		t.Fatal("an eighth node got a subnet of a range of seven")
	} else {
		t.Logf("full: %v", err)
	}

	// Agent 5's Node goes: its claim goes with it, and the late node gets
	// the subnet.
	if err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: agents[5].opts.NodeName}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "the claim of the deleted node to go", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: rules.NodeLeaseNamespace, Name: network.SubnetClaimName(got[5])}, &coordinationv1.Lease{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	freed, err := late.claimGuestSubnet(ctx, env.Config, subnets)
	if err != nil || freed != got[5] {
		t.Errorf("the late node got %v, %v; want the freed %s", freed, err, got[5])
	}
}

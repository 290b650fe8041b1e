package controller

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// The grace counts from when this controller saw the Lease change, and a
// node already judged unreachable stays so after a restart of the
// controller until its Lease really changes.
func TestNodeHealthSighting(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	node := func(agent corev1.ConditionStatus) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
		if agent != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeConditionType(kaironv1.NodeConditionAgentReady), Status: agent}}
		}
		return n
	}
	lease := func(rv string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv}}
	}
	grace := rules.DefaultNodeGracePeriod

	r := &NodeHealthReconciler{seen: map[string]leaseSighting{}}
	seen := r.sight(node(""), lease("1"), t0)
	if rules.LeaseExpired(seen, t0.Add(grace), grace) {
		t.Error("a Lease first seen is expired within the grace")
	}
	if seen = r.sight(node(corev1.ConditionTrue), lease("1"), t0.Add(time.Minute)); !rules.LeaseExpired(seen, t0.Add(time.Minute), grace) {
		t.Error("a Lease unchanged for a minute is not expired")
	}
	if seen = r.sight(node(corev1.ConditionUnknown), lease("2"), t0.Add(2*time.Minute)); rules.LeaseExpired(seen, t0.Add(2*time.Minute), grace) {
		t.Error("a renewed Lease is still expired")
	}

	restarted := &NodeHealthReconciler{seen: map[string]leaseSighting{}}
	later := t0.Add(time.Hour)
	if seen = restarted.sight(node(corev1.ConditionUnknown), lease("2"), later); !rules.LeaseExpired(seen, later, grace) {
		t.Error("after a restart, an unreachable node came back without its Lease changing")
	}
	if seen = restarted.sight(node(corev1.ConditionUnknown), lease("3"), later.Add(time.Second)); rules.LeaseExpired(seen, later.Add(time.Second), grace) {
		t.Error("after a restart, a renewed Lease did not bring the node back")
	}
}

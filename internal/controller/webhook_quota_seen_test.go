package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// The race a clean-clone run once lost (16 parallel creates against a
// quota of 3 admitted 4): Machine A, admitted and charged, is stored and
// delivered by the watch while admission B is listing the namespace, and
// B's list does not have it yet. A then counts in neither the list nor,
// if its sighting settled its charge, the charges. It must stay charged.
func TestMachineQuotaKeepsTheChargeOfAMachineSeenDuringTheList(t *testing.T) {
	ns := "team"
	now := time.Now()
	a := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a", UID: "uid-a"},
		Spec:       kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi")},
	}
	quota := &kaironv1.MachineQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "one", Annotations: map[string]string{
			kaironv1.AnnotationQuotaAdmissionCharges: rules.FormatAdmissionCharges([]rules.AdmissionCharge{rules.ChargeFor(a, now, false)}),
		}},
		Spec: kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To[int32](1)}},
	}
	seen := newSeenMachines()
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(quota).
		WithInterceptorFuncs(interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*kaironv1.MachineList); ok {
				// A is stored now and the watch delivers it, but this
				// list was read just before: it does not hold A.
				seen.observe(a)
			}
			return c.List(ctx, list, opts...)
		}}).Build()
	v := &MachineValidator{Reader: c, Writer: c, Seen: seen.seenBefore}

	b := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b", UID: "uid-b"},
		Spec:       kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi")},
	}
	_, err := v.ValidateCreate(context.Background(), b)
	if err == nil || !strings.Contains(err.Error(), `MachineQuota "one"`) {
		t.Fatalf("a second Machine against a quota of 1 while the first is stored but missing from the list: %v, want refused by the quota", err)
	}

	// Once a list holds A, its sighting (or its being listed) settles the
	// charge, and A counts as stored: still no room for B.
	if err := c.Create(context.Background(), a.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if _, err := v.ValidateCreate(context.Background(), b); err == nil {
		t.Fatal("a second Machine against a quota of 1 with the first listed: admitted")
	}
	var q kaironv1.MachineQuota
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "one"}, &q); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(q.Annotations[kaironv1.AnnotationQuotaAdmissionCharges], "uid-b") {
		t.Errorf("refused Machine b was charged: %s", q.Annotations[kaironv1.AnnotationQuotaAdmissionCharges])
	}
}

package node

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node/egress"
)

func TestDeniedDNSIsCountedAndReportedOnceAMinute(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := kaironv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	machine := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "vm"}}
	rec := events.NewFakeRecorder(10)
	a := &Agent{client: fake.NewClientBuilder().WithScheme(scheme).WithObjects(machine).Build(), recorder: rec}
	m := egress.Machine{Namespace: "team-a", Name: "vm"}
	ctx := context.Background()
	for i := range 3 {
		a.deniedDNS(ctx, m, fmt.Sprintf("x%d.test", i))
	}
	v, _ := a.egressDenials.Load(egressMachine{"team-a", "vm"})
	d := v.(*dnsDenials)
	if got := d.count(); got != 3 {
		t.Fatalf("counted %d refusals, want 3", got)
	}
	if len(rec.Events) != 1 {
		t.Fatalf("%d events for three refusals within a minute, want 1", len(rec.Events))
	}
	if e := <-rec.Events; !strings.Contains(e, "Warning "+kaironv1.EventReasonEgressDenied) || !strings.Contains(e, `"x0.test"`) {
		t.Fatalf("event %q, want a Warning naming the first refused name", e)
	}
	// A minute on (the last event moved back rather than waited for).
	d.mu.Lock()
	d.lastEvent = d.lastEvent.Add(-egressEventInterval)
	d.mu.Unlock()
	a.deniedDNS(ctx, m, "y.test")
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, `"y.test"`) {
			t.Fatalf("event %q, want it to name y.test", e)
		}
	default: // deniedDNS records synchronously
		t.Fatal("no event for the first refusal of the next minute")
	}
}

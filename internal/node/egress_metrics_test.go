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

func TestAgentDenialsAreCountedAndReportedOnceAMinute(t *testing.T) {
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
		a.deniedInAgent(ctx, m, egress.ReasonDNS, fmt.Sprintf("refused the DNS query for %q", fmt.Sprintf("x%d.test", i)))
	}
	a.deniedInAgent(ctx, m, egress.ReasonSNI, `reset a TLS connection naming "z.test"`)
	v, _ := a.egressDenials.Load(egressMachine{"team-a", "vm"})
	d := v.(*egressDenials)
	if got := d.counts(); got[egress.ReasonDNS] != 3 || got[egress.ReasonSNI] != 1 {
		t.Fatalf("counted %v, want 3 dns and 1 sni", got)
	}
	if len(rec.Events) != 1 {
		t.Fatalf("%d events for four refusals within a minute, want 1", len(rec.Events))
	}
	if e := <-rec.Events; !strings.Contains(e, "Warning "+kaironv1.EventReasonEgressDenied) || !strings.Contains(e, `"x0.test"`) {
		t.Fatalf("event %q, want a Warning naming the first refused name", e)
	}
	// A minute on (the last event moved back rather than waited for).
	d.mu.Lock()
	d.lastEvent = d.lastEvent.Add(-egressEventInterval)
	d.mu.Unlock()
	a.deniedInAgent(ctx, m, egress.ReasonDNS, `refused the DNS query for "y.test"`)
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, `"y.test"`) {
			t.Fatalf("event %q, want it to name y.test", e)
		}
	default: // deniedInAgent records synchronously
		t.Fatal("no event for the first refusal of the next minute")
	}
}

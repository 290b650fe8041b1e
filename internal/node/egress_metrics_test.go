package node

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

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

func TestDroppedPacketsAreReportedFirstOfEachMinute(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := kaironv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	vm := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "vm"}}
	rec := events.NewFakeRecorder(10)
	a := &Agent{client: fake.NewClientBuilder().WithScheme(scheme).WithObjects(vm).Build(), recorder: rec}
	m := egress.Machine{Namespace: "team-a", Name: "vm"}
	drop := func(addr string, port uint16, reason string, age time.Duration) egress.DeniedDestination {
		return egress.DeniedDestination{Machine: m, Reason: reason, Address: netip.MustParseAddr(addr), Protocol: "tcp", Port: port, Age: age}
	}
	ctx := context.Background()
	reported := map[egressMachine]time.Time{}
	now := time.Now()
	// Oldest first, as DeniedDestinations returns them.
	a.reportDrops(ctx, []egress.DeniedDestination{drop("203.0.113.20", 8050, egress.ReasonIP, 3*time.Second), drop("203.0.113.10", 9000, egress.ReasonPort, time.Second)}, now, reported)
	if len(rec.Events) != 1 {
		t.Fatalf("%d events, want 1", len(rec.Events))
	}
	if e := <-rec.Events; !strings.Contains(e, "Warning "+kaironv1.EventReasonEgressDenied) || !strings.Contains(e, "dropped tcp 203.0.113.20:8050 (ip: no policy allows the destination)") {
		t.Fatalf("event %q, want the first dropped destination and why", e)
	}
	// Within the minute: nothing more, whatever is dropped.
	a.reportDrops(ctx, []egress.DeniedDestination{drop("203.0.113.30", 443, egress.ReasonIP, 0)}, now.Add(5*time.Second), reported)
	if len(rec.Events) != 0 {
		t.Fatalf("an event within the minute: %q", <-rec.Events)
	}
	// A minute on (the last event moved back rather than waited for): the
	// drop already reported is not reported again, a newer one is.
	d := a.denialsOf(m)
	d.mu.Lock()
	d.lastEvent = d.lastEvent.Add(-egressEventInterval)
	d.mu.Unlock()
	a.reportDrops(ctx, []egress.DeniedDestination{drop("203.0.113.20", 8050, egress.ReasonIP, 10*time.Second), drop("203.0.113.30", 443, egress.ReasonIP, 5*time.Second)}, now.Add(10*time.Second), reported)
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, "203.0.113.30:443") {
			t.Fatalf("event %q, want the drop after the last report", e)
		}
	default:
		t.Fatal("no event for the next minute's first drop")
	}
}

package node

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node/egress"
)

// EgressDeniedCounter is an enforcer that counts its drops (nftables
// counters); the agent exports them.
type EgressDeniedCounter interface {
	DeniedCounts() ([]egress.Denied, error)
}

// egressCollector reads the counters at scrape time. One for the process
// (egressMetrics, in metrics.go): tests and kairon-local run several agents
// in one.
type egressCollector struct {
	mu     sync.Mutex
	agents map[*Agent]struct{}
}

func (c *egressCollector) add(a *Agent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.agents[a] = struct{}{}
}

func (c *egressCollector) remove(a *Agent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.agents, a)
}

func (c *egressCollector) Describe(ch chan<- *prometheus.Desc) { ch <- egressDeniedDesc }

func (c *egressCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	agents := make([]*Agent, 0, len(c.agents))
	for a := range c.agents {
		agents = append(agents, a)
	}
	c.mu.Unlock()
	type key struct{ namespace, machine, reason string }
	sums := map[key]uint64{}
	for _, a := range agents {
		if counter, ok := a.egress.(EgressDeniedCounter); ok {
			ds, err := counter.DeniedCounts()
			if err == nil {
				for _, d := range ds {
					sums[key{d.Machine.Namespace, d.Machine.Name, d.Reason}] += d.Packets
				}
			}
		}
		a.egressDenials.Range(func(k, v any) bool {
			m := k.(egressMachine)
			for reason, n := range v.(*egressDenials).counts() {
				sums[key{m.namespace, m.name, reason}] += n
			}
			return true
		})
	}
	for k, v := range sums {
		ch <- prometheus.MustNewConstMetric(egressDeniedDesc, prometheus.CounterValue, float64(v), k.namespace, k.machine, k.reason)
	}
}

type egressMachine struct{ namespace, name string }

// egressDenials are one Machine's refusals counted in the agent (DNS
// queries, TLS server names), by reason, and the time of its last egress
// Warning event: one a minute at most, whatever the reason.
type egressDenials struct {
	mu        sync.Mutex
	n         map[string]uint64
	lastEvent time.Time
}

func (a *Agent) denialsOf(m egress.Machine) *egressDenials {
	v, _ := a.egressDenials.LoadOrStore(egressMachine{m.Namespace, m.Name}, &egressDenials{n: map[string]uint64{}})
	return v.(*egressDenials)
}

func (d *egressDenials) counts() map[string]uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.n)
}

// mayReport tells whether the Machine's next egress event may be recorded
// now, and if so takes its turn.
func (d *egressDenials) mayReport(now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.lastEvent.IsZero() && now.Sub(d.lastEvent) < egressEventInterval {
		return false
	}
	d.lastEvent = now
	return true
}

// egressEventInterval is the least time between two egress Warning events
// of one Machine.
const egressEventInterval = time.Minute

// deniedInAgent counts a refusal the agent made itself (reason dns or sni)
// and reports it as deniedEvent does.
func (a *Agent) deniedInAgent(ctx context.Context, m egress.Machine, reason, what string) {
	d := a.denialsOf(m)
	d.mu.Lock()
	d.n[reason]++
	d.mu.Unlock()
	a.deniedEvent(ctx, m, what)
}

// deniedEvent records a Warning event on the Machine saying what its
// policy refused, the first refusal of each minute; the others are only
// counted.
func (a *Agent) deniedEvent(ctx context.Context, m egress.Machine, what string) bool {
	if !a.denialsOf(m).mayReport(time.Now()) {
		return false
	}
	machine := &kaironv1.Machine{}
	if err := a.client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Name}, machine); err != nil {
		return false
	}
	a.event(machine, corev1.EventTypeWarning, kaironv1.EventReasonEgressDenied,
		fmt.Sprintf("egress policy %s (further refusals within a minute are counted in kairon_egress_denied_total, not reported)", what))
	return true
}

// EgressDropRecorder is an enforcer that keeps the destinations it
// dropped lately (nftables sets); the agent names them in events.
type EgressDropRecorder interface {
	DeniedDestinations() ([]egress.DeniedDestination, error)
}

// dropReasons say why a packet was dropped, in events.
var dropReasons = map[string]string{
	egress.ReasonIP:   "no policy allows the destination",
	egress.ReasonPort: "the destination is allowed, not this port or protocol",
	egress.ReasonICMP: "no policy allows ICMP to the destination",
}

// reportEgressDrops names, every interval, the first packet each confined
// Machine had dropped since its last report, in a Warning event (one a
// minute, shared with the DNS and SNI refusals).
func (a *Agent) reportEgressDrops(ctx context.Context) error {
	rec, ok := a.egress.(EgressDropRecorder)
	if !ok {
		return nil
	}
	reported := map[egressMachine]time.Time{}
	ticker := time.NewTicker(a.opts.Interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		ds, err := rec.DeniedDestinations()
		if err != nil {
			log.FromContext(ctx).Error(err, "reading the egress drop records")
			continue
		}
		a.reportDrops(ctx, ds, time.Now(), reported)
	}
}

// reportDrops reports, per Machine, the oldest drop of ds (oldest first)
// that happened after the Machine's last report.
func (a *Agent) reportDrops(ctx context.Context, ds []egress.DeniedDestination, now time.Time, reported map[egressMachine]time.Time) {
	done := map[egressMachine]bool{}
	for _, d := range ds {
		k := egressMachine{d.Machine.Namespace, d.Machine.Name}
		if done[k] || !now.Add(-d.Age).After(reported[k]) {
			continue
		}
		done[k] = true
		what := fmt.Sprintf("dropped %s (%s: %s)", d, d.Reason, dropReasons[d.Reason])
		if a.deniedEvent(ctx, d.Machine, what) {
			reported[k] = now
		}
	}
}

// metricsAddress is the manager's metrics bind address: "0" turns it off.
func metricsAddress(addr string) string {
	if addr == "" {
		return "0"
	}
	return addr
}

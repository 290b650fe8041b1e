package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node/egress"
)

// EgressDeniedCounter is an enforcer that counts its drops (nftables
// counters); the agent exports them.
type EgressDeniedCounter interface {
	DeniedCounts() ([]egress.Denied, error)
}

var egressDeniedDesc = prometheus.NewDesc("kairon_egress_denied_total",
	"Packets and DNS queries of Machines confined by a MachineNetworkPolicy that were refused, by reason: ip (destination allowed by no policy), port (destination allowed, not the port or protocol), icmp, dns (a name no policy allows).",
	[]string{"namespace", "machine", "reason"}, nil)

// egressCollector reads the counters at scrape time. One for the process:
// tests and kairon-local run several agents in one.
type egressCollector struct {
	mu     sync.Mutex
	agents map[*Agent]struct{}
}

var egressMetrics = &egressCollector{agents: map[*Agent]struct{}{}}

func init() { metrics.Registry.MustRegister(egressMetrics) }

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
			sums[key{m.namespace, m.name, egress.ReasonDNS}] += v.(*dnsDenials).count()
			return true
		})
	}
	for k, v := range sums {
		ch <- prometheus.MustNewConstMetric(egressDeniedDesc, prometheus.CounterValue, float64(v), k.namespace, k.machine, k.reason)
	}
}

type egressMachine struct{ namespace, name string }

// dnsDenials counts one Machine's refused queries and limits its Warning
// events to one a minute.
type dnsDenials struct {
	mu        sync.Mutex
	n         uint64
	lastEvent time.Time
}

func (d *dnsDenials) count() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// egressEventInterval is the least time between two egress Warning events
// of one Machine.
const egressEventInterval = time.Minute

// deniedDNS counts a refused query and records a Warning event on the
// Machine naming it, the first of each minute.
func (a *Agent) deniedDNS(ctx context.Context, m egress.Machine, name string) {
	v, _ := a.egressDenials.LoadOrStore(egressMachine{m.Namespace, m.Name}, &dnsDenials{})
	d := v.(*dnsDenials)
	d.mu.Lock()
	d.n++
	now := time.Now()
	record := d.lastEvent.IsZero() || now.Sub(d.lastEvent) >= egressEventInterval
	if record {
		d.lastEvent = now
	}
	d.mu.Unlock()
	if !record {
		return
	}
	machine := &kaironv1.Machine{}
	if err := a.client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Name}, machine); err != nil {
		return
	}
	a.event(machine, corev1.EventTypeWarning, kaironv1.EventReasonEgressDenied,
		fmt.Sprintf("egress policy refused the DNS query for %q (further refusals within a minute are counted in kairon_egress_denied_total, not reported)", name))
}

// metricsAddress is the manager's metrics bind address: "0" turns it off.
func metricsAddress(addr string) string {
	if addr == "" {
		return "0"
	}
	return addr
}

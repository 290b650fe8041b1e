package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// BenchmarkSchedulerBurst times the scheduler alone placing a burst of 300
// new Machines on 4 nodes (no node agent: nothing else writes), from the
// first create to the last Machine with a node, as a polling client sees
// it. (With no agent to record the placement, the Scheduled status follows
// nodePickupGrace later, which is not the scheduler's speed.)
//
//	go test -run '^$' -bench SchedulerBurst -benchtime 3x ./internal/controller/
func BenchmarkSchedulerBurst(b *testing.B) {
	const machines = 300
	env := testenv.Get(b)
	for range b.N {
		ns := env.Namespace(b)
		for i := range 4 {
			createNode(b, env, ns, fmt.Sprintf("n%d", i), 128, "64Gi")
		}
		stop := startControllers(b, env, ns, Options{})
		start := time.Now()
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := w; i < machines; i += 16 {
					m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("m-%03d", i)},
						Spec: kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi")}}
					if err := env.Client.Create(context.Background(), m); err != nil {
						b.Error(err)
					}
				}
			})
		}
		wg.Wait()
		created := time.Since(start)
		testenv.Eventually(b, 10*time.Minute, "every Machine scheduled", func() (bool, string) {
			var list kaironv1.MachineList
			if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			n := 0
			for _, m := range list.Items {
				if m.Spec.NodeName != "" {
					n++
				}
			}
			return n == machines, fmt.Sprintf("%d/%d scheduled", n, machines)
		})
		took := time.Since(start)
		b.ReportMetric(took.Seconds(), "s-to-schedule-all")
		b.ReportMetric(float64(machines)/took.Seconds(), "machines/s")
		b.Logf("%d Machines created in %s, all scheduled after %s", machines, created.Round(time.Millisecond), took.Round(time.Millisecond))
		stop()
	}
	b.ReportMetric(0, "ns/op")
}

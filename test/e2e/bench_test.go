package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// BenchmarkMachineColdBoot measures what a user waits for without a warm
// pool: a Machine created through the API until it is Running (scheduled,
// VM started, guest ready), one at a time, through the real controller and
// agent. It reports the median and p95 and the resident memory of each VM.
//
//	go test -run '^$' -bench MachineColdBoot -benchtime 10x ./test/e2e/
func BenchmarkMachineColdBoot(b *testing.B) {
	env := testenv.Get(b)
	ns := env.Namespace(b)
	ctx := context.Background()
	state := b.TempDir()
	b.Cleanup(func() { killVMs(b, state) })
	startController(b, env)
	startAgent(b, env, "bench-boot", state, netns(b))
	deleteNodeAtEnd(b, env, "bench-boot")

	var boots []time.Duration
	var rssMiB []float64
	accel := ""
	b.ResetTimer()
	for i := range b.N {
		name := "cold-" + strconv.Itoa(i)
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		start := time.Now()
		if err := env.Client.Create(ctx, m); err != nil {
			b.Fatal(err)
		}
		key := client.ObjectKeyFromObject(m)
		// The boot ends when the check first sees Running, within one poll
		// (testenv.PollInterval) of the agent writing it.
		var boot time.Duration
		testenv.Eventually(b, 3*time.Minute, name+" Running", func() (bool, string) {
			if err := env.Client.Get(ctx, key, m); err != nil {
				b.Fatal(err)
			}
			if m.Status.Phase == kaironv1.MachineFailed {
				b.Fatalf("%s: %s %s", name, m.Status.Phase, m.Status.Message)
			}
			boot = time.Since(start)
			return m.Status.Phase == kaironv1.MachineRunning, string(m.Status.Phase)
		})
		boots = append(boots, boot)
		accel = m.Status.Acceleration
		b.StopTimer()
		if pid, ok := vmProcesses(b, state)[ns+"/"+name]; ok {
			rssMiB = append(rssMiB, residentMiB(pid))
		}
		if err := env.Client.Delete(ctx, m); err != nil {
			b.Fatal(err)
		}
		testenv.Eventually(b, time.Minute, name+" deleted", func() (bool, string) {
			err := env.Client.Get(ctx, key, m)
			return err != nil, string(m.Status.Phase)
		})
		b.StartTimer()
	}
	b.StopTimer()
	sort.Slice(boots, func(i, j int) bool { return boots[i] < boots[j] })
	b.ReportMetric(ms(percentile(boots, 50)), "median-ms")
	b.ReportMetric(ms(percentile(boots, 95)), "p95-ms")
	if len(rssMiB) > 0 {
		sort.Float64s(rssMiB)
		b.ReportMetric(rssMiB[len(rssMiB)/2], "rss-MiB/vm")
	}
	b.Logf("acceleration %s; boots %v", accel, boots)
}

func percentile(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100 // nearest rank
	return sorted[max(i-1, 0)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func residentMiB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

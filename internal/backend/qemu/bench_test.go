package qemu

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

// BenchmarkColdBoot measures Start → Running of the default guest (no NIC,
// 1 vCPU, 256 MiB), reporting the mean boot in ms and QEMU's resident memory
// once the guest is ready.
func BenchmarkColdBoot(b *testing.B) {
	be := newTestBackend(b, Options{})
	ctx := context.Background()
	var total time.Duration
	var rssKB int64
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("bench_vm%d", i)
		start := time.Now()
		inst, err := be.Start(ctx, backend.Spec{ID: id, Name: "bench/vm", CPU: 1, MemoryMiB: 256})
		if err != nil {
			b.Fatal(err)
		}
		for inst.Phase != backend.Running {
			time.Sleep(2 * time.Millisecond)
			if inst, err = be.Get(ctx, id); err != nil || inst.Phase == backend.Exited {
				b.Fatalf("%+v %v", inst, err)
			}
			if time.Since(start) > bootTimeout {
				b.Fatalf("not Running after %s: %+v", bootTimeout, inst)
			}
		}
		b.StopTimer()
		total += inst.ReadyAfter
		kb := vmRSSkB(inst.PID)
		rssKB += kb
		b.Logf("boot %d: ready after %s (Start→Running seen at %s), RSS %d MiB, %s", i, inst.ReadyAfter.Round(time.Millisecond),
			time.Since(start).Round(time.Millisecond), kb/1024, inst.Acceleration)
		if err := be.Stop(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/boot")
	b.ReportMetric(float64(rssKB)/1024/float64(b.N), "MiB-RSS/VM")
}

func vmRSSkB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:")), &kb)
			return kb
		}
	}
	return 0
}

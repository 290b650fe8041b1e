package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
		if _, err := be.Start(ctx, backend.Spec{ID: id, Name: "bench/vm", CPU: 1, MemoryMiB: 256}); err != nil {
			b.Fatal(err)
		}
		// ms/boot is the backend's own ReadyAfter; ns/op also counts up to
		// one poll interval of the wait.
		inst := waitPhase(b, be, id, backend.Running, bootTimeout)
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

// BenchmarkMigration moves one running default guest (1 vCPU, 256 MiB, no
// NIC) back and forth between two Backends, as between two nodes' agents:
// live over a loopback TCP connection, or cold (Save to a file, Restore on
// the other side). It reports the wall time of one move and the guest's
// downtime (live: QEMU's measurement; cold: from Save to the restored guest
// running).
func BenchmarkMigration(b *testing.B) {
	for _, strategy := range []string{"live", "cold"} {
		b.Run(strategy, func(b *testing.B) {
			ctx := context.Background()
			nodes := [2]*Backend{newTestBackend(b, Options{}), newTestBackend(b, Options{})}
			spec := backend.Spec{ID: "bench_mover", Name: "bench/mover", CPU: 1, MemoryMiB: 256}
			if _, err := nodes[0].Start(ctx, spec); err != nil {
				b.Fatal(err)
			}
			waitPhase(b, nodes[0], spec.ID, backend.Running, bootTimeout)
			var took, down time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				from, to := nodes[i%2], nodes[(i+1)%2]
				start := time.Now()
				if strategy == "live" {
					send, receive := tcpPair(b)
					received := make(chan error, 1)
					go func() { _, err := to.ReceiveLive(ctx, spec, receive); received <- err }()
					downtime, err := from.SendLive(ctx, spec.ID, send, backend.LiveOptions{})
					if err != nil {
						b.Fatal(err)
					}
					if err := <-received; err != nil {
						b.Fatal(err)
					}
					down += downtime
				} else {
					path := filepath.Join(b.TempDir(), "state")
					if err := from.Save(ctx, spec.ID, path); err != nil {
						b.Fatal(err)
					}
					if _, err := to.Restore(ctx, spec, path); err != nil {
						b.Fatal(err)
					}
					down += time.Since(start)
				}
				took += time.Since(start)
				b.StopTimer()
				if err := from.Stop(ctx, spec.ID); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "ms/move")
			b.ReportMetric(float64(down.Microseconds())/1000/float64(b.N), "ms-downtime/move")
		})
	}
}

package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/ui"
)

// BenchmarkScale is issue 14's benchmark: 2,000 Machines, then the time to
// first byte and the size (gzip, as browsers fetch it) of the overview page
// and of /api/v1/machines,
// and the heap of the process serving them (the UI's cache is most of it).
//
//	go test -run '^$' -bench Scale -benchtime 20x ./internal/ui/
func BenchmarkScale(b *testing.B) {
	env := testenv.Get(b)
	ns := env.Namespace(b)
	const machines = 2000
	var wg sync.WaitGroup
	errs := make(chan error, machines)
	sem := make(chan struct{}, 32)
	for i := range machines {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			m := &kaironv1.Machine{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("vm-%04d", i), Labels: map[string]string{"app": "bench"}},
				Spec:       kaironv1.MachineSpec{NodeName: fmt.Sprintf("node-%d", i%20), CPU: 1, Memory: resource.MustParse("256Mi")},
			}
			if err := env.Client.Create(context.Background(), m); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := ui.New(env.Config, ui.Options{})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		b.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)

	for _, path := range []string{"/", "/api/v1/machines"} {
		b.Run(path, func(b *testing.B) {
			var ttfb time.Duration
			size := 0
			for b.Loop() {
				start := time.Now()
				w := &firstByte{start: start}
				req, _ := http.NewRequest(http.MethodGet, path, nil)
				req.Header.Set("Accept-Encoding", "gzip")
				srv.Handler().ServeHTTP(w, req)
				ttfb += w.at
				size = w.n
				if w.code != 0 && w.code != http.StatusOK {
					b.Fatalf("%s: %d", path, w.code)
				}
			}
			b.ReportMetric(float64(ttfb.Microseconds())/1000/float64(b.N), "ttfb-ms")
			b.ReportMetric(float64(size)/1024, "gzip-KiB")
			b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MiB")
		})
	}
}

// firstByte is a ResponseWriter that notes when the first byte was written
// and counts the bytes.
type firstByte struct {
	start time.Time
	at    time.Duration
	n     int
	code  int
	h     http.Header
}

func (f *firstByte) Header() http.Header {
	if f.h == nil {
		f.h = http.Header{}
	}
	return f.h
}

func (f *firstByte) WriteHeader(code int) { f.code = code }

func (f *firstByte) Write(p []byte) (int, error) {
	if f.n == 0 {
		f.at = time.Since(f.start)
	}
	f.n += len(p)
	return len(p), nil
}

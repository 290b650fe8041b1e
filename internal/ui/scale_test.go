package ui_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
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
// first byte and the size (gzip, as browsers fetch it, and without) of the
// overview page, of /api/v1/machines (its default page of 500) and of all
// 2,000 in one answer, served in-process; and, with KAIRON_BIN_DIR set (as
// make test and make bench set it), the same over HTTP from bin/kairon-ui
// run as its own process with a kubeconfig, and that process's resident
// memory once its cache is filled.
//
//	make build
//	KAIRON_BIN_DIR=$PWD/bin go test -run '^$' -bench Scale -benchtime 20x ./internal/ui/
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

	for _, path := range benchPaths {
		plain := &firstByte{}
		req, _ := http.NewRequest(http.MethodGet, path, nil)
		srv.Handler().ServeHTTP(plain, req)
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
			b.ReportMetric(float64(plain.n)/1024, "plain-KiB")
			b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MiB")
		})
	}
	b.Run("process", func(b *testing.B) { benchProcess(b, env) })
}

// benchPaths are the requests measured.
var benchPaths = []string{"/", "/api/v1/machines", "/api/v1/machines?limit=2000", "/machines"}

// benchProcess runs $KAIRON_BIN_DIR/kairon-ui against the test API server
// with its admin kubeconfig, reads its resident memory from /proc once it
// serves (its cache filled: it listens only then), and measures each path
// over HTTP on loopback: time to first byte as the client sees it.
func benchProcess(b *testing.B, env *testenv.Env) {
	dir := os.Getenv("KAIRON_BIN_DIR")
	if dir == "" {
		b.Skip("KAIRON_BIN_DIR is not set: make build, then KAIRON_BIN_DIR=$PWD/bin, to measure kairon-ui as its own process")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "kairon-ui"), "--kubeconfig", env.Kubeconfig, "--listen", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Wait() }()
	defer cancel()
	line, err := bufio.NewReader(out).ReadString('\n')
	_, rest, ok := strings.Cut(line, "kairon-ui: serving ")
	if err != nil || !ok {
		b.Fatalf("kairon-ui printed %q (%v); stderr: %s", line, err, stderr.String())
	}
	ready := time.Since(start)
	url, _, _ := strings.Cut(rest, " ")
	rssAtStart := rssMiB(b, cmd.Process.Pid)
	client := &http.Client{Transport: &http.Transport{}}
	for _, path := range benchPaths {
		b.Run(path, func(b *testing.B) {
			var ttfb, total time.Duration
			size := 0
			for b.Loop() {
				var first time.Time
				req, _ := http.NewRequest(http.MethodGet, url+path, nil)
				req.Header.Set("Accept-Encoding", "gzip")
				req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }}))
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "gzip" {
					b.Fatalf("%s: %s, %v, Content-Encoding %q", path, resp.Status, err, resp.Header.Get("Content-Encoding"))
				}
				ttfb += first.Sub(t0)
				total += time.Since(t0)
				size = int(n)
			}
			b.ReportMetric(float64(ttfb.Microseconds())/1000/float64(b.N), "ttfb-ms")
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "total-ms")
			b.ReportMetric(float64(size)/1024, "gzip-KiB")
			b.ReportMetric(rssMiB(b, cmd.Process.Pid), "rss-MiB")
		})
	}
	b.Logf("kairon-ui (pid %d) served after %s; RSS %.1f MiB with its cache filled, %.1f MiB after the requests", cmd.Process.Pid, ready.Round(time.Millisecond), rssAtStart, rssMiB(b, cmd.Process.Pid))
}

// rssMiB is VmRSS of /proc/PID/status in MiB.
func rssMiB(b *testing.B, pid int) float64 {
	b.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb float64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%f kB", &kb); err != nil {
				b.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb / 1024
		}
	}
	b.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
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

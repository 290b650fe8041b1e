package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/zyvor/kairon/internal/localport"
	"github.com/zyvor/kairon/internal/testenv"
)

// claimBenchProfileEnv names a directory: TestClaimBench then saves CPU
// profiles of kairon-controller and of kube-apiserver (kairon-local runs
// it with --apiserver-profiling) taken during each burst of more than one
// claim there: controller-C<size>.pprof and apiserver-C<size>.pprof, read
// with go tool pprof bin/kairon-controller FILE (bin/kube-apiserver).
const claimBenchProfileEnv = "KAIRON_CLAIM_BENCH_PROFILE"

// benchController is the kairon-controller a benchmark runs, with its
// metrics and profiling endpoints on loopback, so that the benchmark can
// say how much CPU the controller spent per bind and where.
type benchController struct {
	t       testing.TB
	metrics string
	pprof   string
	// apiServer, when set, is profiled beside the controller: the admin's
	// client of a kube-apiserver that serves /debug/pprof/.
	apiServer rest.Interface
}

func startBenchController(t testing.TB, env *testenv.Env) *benchController {
	t.Helper()
	bc := &benchController{t: t, metrics: freeLoopbackAddress(t), pprof: freeLoopbackAddress(t)}
	startControllerWith(t, env, "-metrics-bind-address", bc.metrics, "-pprof-bind-address", bc.pprof)
	testenv.Eventually(t, 2*time.Minute, "kairon-controller's metrics", func() (bool, string) {
		_, err := bc.readCPUSeconds()
		return err == nil, fmt.Sprint(err)
	})
	return bc
}

// freeLoopbackAddress is an address on 127.0.0.1 for a process the test
// starts to listen on, below the ephemeral range (see localport).
func freeLoopbackAddress(t testing.TB) string {
	t.Helper()
	addr, err := localport.FreeAddress()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// cpuSeconds is the controller process's CPU time so far (user and
// system), from its process_cpu_seconds_total.
func (bc *benchController) cpuSeconds() float64 {
	v, err := bc.readCPUSeconds()
	if err != nil {
		bc.t.Fatalf("kairon-controller's CPU time: %v", err)
	}
	return v
}

func (bc *benchController) readCPUSeconds() (float64, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + bc.metrics + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("/metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_cpu_seconds_total "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("/metrics has no process_cpu_seconds_total")
}

// profileBurst starts a CPU profile of the controller covering a burst of
// c claims when claimBenchProfileEnv asks for one; the returned function
// waits for it and says where it went. The profile's length is fixed in
// advance (Go's profiler takes a duration): about as long as such a burst
// takes to bind here, so the profile shows the binds and the refills they
// start.
func (bc *benchController) profileBurst(c int) (wait func()) {
	dir := os.Getenv(claimBenchProfileEnv)
	if dir == "" || c < 2 {
		return func() {}
	}
	seconds := min(max(2, 3*c/100), 30)
	type profile struct {
		process, file string
		done          chan error
	}
	var profiles []profile
	take := func(process string, get func(seconds int) (io.ReadCloser, error)) {
		p := profile{process: process, file: filepath.Join(dir, fmt.Sprintf("%s-C%d.pprof", process, c)), done: make(chan error, 1)}
		go func() { p.done <- saveProfile(p.file, seconds, get) }()
		profiles = append(profiles, p)
	}
	take("controller", bc.controllerProfile)
	if bc.apiServer != nil {
		take("apiserver", bc.apiServerProfile)
	}
	return func() {
		for _, p := range profiles {
			if err := <-p.done; err != nil {
				bc.t.Errorf("profiling %s: %v", p.process, err)
				continue
			}
			bc.t.Logf("  %s CPU profile of the burst's first %d s: %s", p.process, seconds, p.file)
		}
	}
}

func (bc *benchController) controllerProfile(seconds int) (io.ReadCloser, error) {
	c := &http.Client{Timeout: time.Duration(seconds+30) * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", bc.pprof, seconds))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("%s: %s", resp.Status, body)
	}
	return resp.Body, nil
}

func (bc *benchController) apiServerProfile(seconds int) (io.ReadCloser, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds+30)*time.Second)
	defer cancel()
	body, err := bc.apiServer.Get().AbsPath("/debug/pprof/profile").Param("seconds", strconv.Itoa(seconds)).DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(body)), nil
}

func saveProfile(file string, seconds int, get func(seconds int) (io.ReadCloser, error)) error {
	body, err := get(seconds)
	if err != nil {
		return err
	}
	defer body.Close()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

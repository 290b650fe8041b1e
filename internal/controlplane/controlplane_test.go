package controlplane_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zyvor/kairon/internal/controlplane"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// widgetCRD is a minimal CRD, so these tests do not depend on Kairon's API;
// shortNames lets a restart show that a changed CRD is applied again.
func widgetCRD(shortNames string) fstest.MapFS {
	return fstest.MapFS{"crds/widgets.yaml": {Data: []byte(`# leading comment document
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.kairon.zyvor.dev
spec:
  group: test.kairon.zyvor.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList, shortNames: ` + shortNames + `}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`)}}
}

// start starts a control plane that is stopped when the test ends, and
// then checks that no process of it is left.
func start(t *testing.T, opts controlplane.Options) *controlplane.ControlPlane {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	began := time.Now()
	cp, err := controlplane.Start(ctx, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("control plane up in %s", time.Since(began).Round(100*time.Millisecond))
	t.Cleanup(func() { stop(t, cp) })
	return cp
}

func stop(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	if err := cp.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	assertNoProcesses(t, cp.DataDir())
}

func assertNoProcesses(t *testing.T, dataDir string) {
	t.Helper()
	procs, err := host.Processes(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		t.Errorf("process %d still running after Stop: %s", p.PID, p.Cmdline)
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
}

// pprofStatus is the HTTP status of one of kube-apiserver's profiling
// endpoints, asked as the admin.
func pprofStatus(t *testing.T, cp *controlplane.ControlPlane) int {
	t.Helper()
	var code int
	err := kubernetes.NewForConfigOrDie(cp.RESTConfig()).Discovery().RESTClient().Get().
		AbsPath("/debug/pprof/").Do(context.Background()).StatusCode(&code).Error()
	if err != nil && code == 0 {
		t.Fatal(err)
	}
	return code
}

func TestRestartKeepsStateAndReappliesCRDs(t *testing.T) {
	bin := host.BinDir(t)
	dir := t.TempDir()
	opts := controlplane.Options{
		DataDir:           dir,
		BinDir:            bin,
		ControllerManager: true,
		CRDs:              widgetCRD("[]"),
		EtcdUnsafeNoFsync: true,
	}
	ctx := context.Background()

	first := start(t, opts)
	cs := kubernetes.NewForConfigOrDie(first.RESTConfig())
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "survivor"}, Data: map[string]string{"k": "v"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("a second Start on the same data dir is refused", func(t *testing.T) {
		_, err := controlplane.Start(ctx, opts)
		want := "another kairon-local is running with data dir " + dir + " (pid " + strconv.Itoa(os.Getpid()) + "): stop it first or choose another --data-dir"
		if err == nil || err.Error() != want {
			t.Fatalf("second Start: got %v, want %q", err, want)
		}
	})

	t.Run("the API server's profiles are off by default", func(t *testing.T) {
		if code := pprofStatus(t, first); code != http.StatusNotFound {
			t.Errorf("GET /debug/pprof/: HTTP %d, want 404 without APIServerProfiling", code)
		}
	})

	stop(t, first)

	opts.CRDs = widgetCRD("[wd]")
	opts.APIServerProfiling = true
	second := start(t, opts)
	t.Run("APIServerProfiling serves the API server's profiles", func(t *testing.T) {
		if code := pprofStatus(t, second); code != http.StatusOK {
			t.Errorf("GET /debug/pprof/: HTTP %d, want 200 with APIServerProfiling", code)
		}
	})
	if got, want := second.RESTConfig().Host, first.RESTConfig().Host; got != want {
		t.Errorf("API server moved from %s to %s across a restart; the kubeconfig would go stale", want, got)
	}
	cs = kubernetes.NewForConfigOrDie(second.RESTConfig())
	got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "survivor", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("ConfigMap created before the restart: %v", err)
	}
	if got.Data["k"] != "v" {
		t.Errorf("ConfigMap data after restart = %v", got.Data)
	}
	crd, err := apiextensionsclient.NewForConfigOrDie(second.RESTConfig()).ApiextensionsV1().
		CustomResourceDefinitions().Get(ctx, "widgets.test.kairon.zyvor.dev", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(crd.Spec.Names.ShortNames, []string{"wd"}) {
		t.Errorf("CRD shortNames after restart with a changed CRD = %v, want [wd]", crd.Spec.Names.ShortNames)
	}

	t.Run("a child that dies is reported by Wait", func(t *testing.T) {
		procs, err := host.Processes("--data-dir=" + filepath.Join(dir, "etcd"))
		if err != nil || len(procs) != 1 {
			t.Fatalf("finding etcd: %v %v", procs, err)
		}
		if err := syscall.Kill(procs[0].PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-second.Wait():
			if !strings.HasPrefix(err.Error(), "etcd stopped unexpectedly (signal: killed); see "+filepath.Join(dir, "logs", "etcd.log")) {
				t.Errorf("Wait reported %q", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Wait reported nothing 30s after etcd was killed")
		}
	})
}

func TestStartFailsWithAClearMessage(t *testing.T) {
	bin := host.BinDir(t)

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port

	// A stand-in etcd that fails at once shows how a child's own words reach
	// the caller; the real binaries cannot be made to fail on demand.
	failing := t.TempDir()
	for name, script := range map[string]string{
		"etcd":           "#!/bin/sh\necho 'first line'\necho 'etcd: member has a corrupt WAL' >&2\nexit 3\n",
		"kube-apiserver": "#!/bin/sh\nexit 1\n",
	} {
		if err := os.WriteFile(filepath.Join(failing, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name string
		opts controlplane.Options
		// want are substrings of the error, in order.
		want []string
	}{
		{
			name: "missing binaries",
			opts: controlplane.Options{BinDir: "/nonexistent/bin", ControllerManager: true},
			want: []string{"etcd, kube-apiserver, kube-controller-manager not found in /nonexistent/bin: run `make tools`"},
		},
		{
			name: "API server port taken",
			opts: controlplane.Options{BinDir: bin, APIServerPort: takenPort},
			want: []string{"port " + strconv.Itoa(takenPort) + " on 127.0.0.1 is already in use: stop what holds it or pass --port"},
		},
		{
			name: "CRD set holds something else",
			opts: controlplane.Options{BinDir: bin, CRDs: fstest.MapFS{"bases/x.yaml": {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")}}},
			want: []string{"CRD file bases/x.yaml: holds a v1 ConfigMap, not an apiextensions.k8s.io/v1 CustomResourceDefinition"},
		},
		{
			name: "child exits during startup",
			opts: controlplane.Options{BinDir: failing},
			want: []string{"etcd stopped unexpectedly (exit status 3); see ", "etcd.log", "\n--- last lines of ", "first line\netcd: member has a corrupt WAL"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.DataDir = t.TempDir()
			// Twice: the second attempt must fail the same way, which shows
			// the first released the data dir lock and left nothing running.
			for range 2 {
				cp, err := controlplane.Start(context.Background(), tt.opts)
				if err == nil {
					_ = cp.Stop()
					t.Fatal("Start succeeded")
				}
				rest := err.Error()
				for _, w := range tt.want {
					i := strings.Index(rest, w)
					if i < 0 {
						t.Fatalf("error %q\ndoes not contain %q (in order)", err, w)
					}
					rest = rest[i+len(w):]
				}
			}
			assertNoProcesses(t, tt.opts.DataDir)
		})
	}
}

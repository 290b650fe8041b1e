package testenv

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/config/crd"
	"github.com/zyvor/kairon/internal/controlplane"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// Environment variables the harness reads.
const (
	// BinDirEnv overrides where the control-plane binaries are looked up.
	BinDirEnv = host.BinDirEnv
	// KeepDataEnv, when set to 1, keeps the data dir (logs, etcd) after the
	// tests instead of deleting it, and prints where it is.
	KeepDataEnv = "KAIRON_TESTENV_KEEP_DATA"
)

// Env is the shared control plane as a test sees it.
type Env struct {
	// Config is an admin (system:masters) client config.
	Config *rest.Config
	// Client is a controller-runtime client whose scheme knows the
	// client-go kinds, apiextensions/v1 and kairon.zyvor.dev/v1alpha1.
	Client client.Client
	Scheme *runtime.Scheme
	// Kubeconfig is an admin kubeconfig file, for kubectl and friends.
	Kubeconfig string
	// BinDir holds the pinned binaries, kubectl included.
	BinDir string
	// DataDir is the control plane's data dir; logs/ there has each
	// process's output.
	DataDir string
}

var (
	mu       sync.Mutex
	inRun    bool
	env      *Env
	cp       *controlplane.ControlPlane
	startErr error
)

// Run runs the package's tests and then stops the control plane, if one was
// started, and removes its data dir. Use it from TestMain.
func Run(m *testing.M) int {
	return run(m, true)
}

// RunWithoutCRDs is Run for a package whose tests install Kairon's CRDs
// themselves (the chart's, with helm): its control plane starts without
// them. Deleting the CRDs instead took the API server about five minutes
// once, on a loaded machine; others report why (each deleted CRD of a
// group rebuilds the group's handlers, the siblings' storage answers 429
// while it reinitialises, and the CRD finalizer backs off exponentially:
// rancher-sandbox/rancher-desktop-2 pull request 208).
func RunWithoutCRDs(m *testing.M) int {
	return run(m, false)
}

// withCRDs says whether the control plane Get starts installs Kairon's CRDs.
var withCRDs = true

func run(m *testing.M, crds bool) int {
	mu.Lock()
	inRun = true
	withCRDs = crds
	mu.Unlock()

	code := m.Run()

	mu.Lock()
	defer mu.Unlock()
	inRun = false
	if cp == nil {
		return code
	}
	if err := cp.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
	}
	if os.Getenv(KeepDataEnv) == "1" {
		fmt.Fprintf(os.Stderr, "testenv: kept data dir %s\n", cp.DataDir())
	} else if err := os.RemoveAll(cp.DataDir()); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: removing data dir: %v\n", err)
	}
	cp, env = nil, nil
	return code
}

// Get returns the package's control plane, starting it on first use. It
// fails t if the control plane cannot start, every time it is asked, with
// the reason (missing binaries say to run `make tools`).
func Get(t testing.TB) *Env {
	t.Helper()
	host.SkipIfShort(t, "a control plane (etcd, kube-apiserver, kube-controller-manager)")
	mu.Lock()
	defer mu.Unlock()
	if !inRun {
		t.Fatal("testenv.Get needs `func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }` in this test package, so the control plane is stopped after the tests")
	}
	if env == nil && startErr == nil {
		env, startErr = start()
	}
	if startErr != nil {
		t.Fatalf("testenv: %v", startErr)
	}
	return env
}

func start() (*Env, error) {
	binDir, err := host.LocateBinDir()
	if err != nil {
		return nil, err
	}
	dataDir, err := os.MkdirTemp("", "kairon-testenv-")
	if err != nil {
		return nil, err
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var crds fs.FS = crd.Bases
	if !withCRDs {
		crds = nil
	}
	started, err := controlplane.Start(ctx, controlplane.Options{
		DataDir:           dataDir,
		BinDir:            binDir,
		ControllerManager: true,
		CRDs:              crds,
		EtcdUnsafeNoFsync: true,
		Log:               slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		_ = os.RemoveAll(dataDir)
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "testenv: control plane ready in %s (data dir %s)\n", time.Since(began).Round(100*time.Millisecond), dataDir)
	// Dies later only if a child crashes; the tests would then fail with
	// connection errors, so say why once.
	go func() {
		if err := <-started.Wait(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		}
	}()

	cfg := started.RESTConfig()
	// client-go's default of 5 QPS would make busy tests wait on the
	// client, not on the server they are testing.
	cfg.QPS, cfg.Burst = 200, 400
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, kaironv1.AddToScheme} {
		if err := add(scheme); err != nil {
			_ = started.Stop()
			_ = os.RemoveAll(dataDir)
			return nil, err
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = started.Stop()
		_ = os.RemoveAll(dataDir)
		return nil, err
	}
	cp = started
	return &Env{
		Config:     cfg,
		Client:     c,
		Scheme:     scheme,
		Kubeconfig: started.KubeconfigPath(),
		BinDir:     binDir,
		DataDir:    started.DataDir(),
	}, nil
}

// Namespace creates a namespace for this test and deletes it when the test
// ends; the namespace controller then removes what the test left in it.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: namespacePrefix(t.Name())}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("testenv: creating namespace: %v", err)
	}
	t.Cleanup(func() {
		err := e.Client.Delete(context.Background(), ns)
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("testenv: deleting namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

// namespacePrefix turns a test name into a valid, recognisable prefix, so a
// namespace seen in the logs can be traced back to its test.
func namespacePrefix(testName string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		if b.Len() >= 40 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	return "t-" + strings.Trim(b.String(), "-") + "-"
}

// BinDir returns the directory with the pinned binaries, failing t with
// what to do when they are not there. It needs no running control plane.
func BinDir(t testing.TB) string {
	t.Helper()
	return host.BinDir(t)
}

// LocateBinDir finds the pinned binaries; see host.LocateBinDir.
func LocateBinDir() (string, error) { return host.LocateBinDir() }

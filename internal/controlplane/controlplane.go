package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Names of the binaries Start runs from Options.BinDir.
const (
	Etcd                  = "etcd"
	KubeAPIServer         = "kube-apiserver"
	KubeControllerManager = "kube-controller-manager"
)

// ServiceClusterIPRange is the apiserver's --service-cluster-ip-range; the
// serving certificate carries its first address (10.96.0.1).
const ServiceClusterIPRange = "10.96.0.0/24"

// KCMControllers are the kube-controller-manager controllers Kairon relies
// on: ownerReference garbage collection, namespace deletion, autoscaling of
// scalable resources (MachinePools), service-account tokens, and the type
// check of ValidatingAdmissionPolicies (their status shows a CEL expression
// that does not fit the schema it checks). Everything
// else (node lifecycle, pods, volumes, ...) would act on objects that a
// micro-VM orchestrator without kubelets never has.
var KCMControllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"horizontal-pod-autoscaler-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"validatingadmissionpolicy-status-controller",
}

// Options configures Start. DataDir and BinDir are required.
type Options struct {
	// DataDir holds all state (see the package comment); it is created if
	// missing and reused across restarts.
	DataDir string
	// BinDir holds the etcd, kube-apiserver and kube-controller-manager
	// binaries (`make tools` builds them into bin/).
	BinDir string
	// APIServerPort is the port kube-apiserver serves on at 127.0.0.1.
	// 0 means the port recorded in DataDir, or on the first start
	// PreferredAPIServerPort when it is free, or else any free port. The
	// port in use is recorded so the kubeconfig stays valid across restarts.
	APIServerPort int
	// PreferredAPIServerPort is tried on a first start with APIServerPort 0.
	PreferredAPIServerPort int
	// ControllerManager runs kube-controller-manager with KCMControllers.
	ControllerManager bool
	// CRDs holds CustomResourceDefinition YAML files (any depth). Each is
	// created or updated, and Start waits until all are Established and
	// served. nil installs none.
	CRDs fs.FS
	// KaironAccess installs the RBAC roles of Kairon's components, bound to
	// their certificates (ControllerKubeconfig, NodeKubeconfig), and the
	// ValidatingAdmissionPolicies that confine node agents to their own
	// node and keep Machine placement with the scheduler: the same rules
	// and policies the Helm chart installs (config/rbac, config/admission).
	// Without it only the admin kubeconfig is of use.
	KaironAccess bool
	// EtcdUnsafeNoFsync makes etcd skip fsync: much faster on slow disks,
	// but a machine crash can corrupt the data. For throwaway test data.
	EtcdUnsafeNoFsync bool
	// APIServerProfiling serves kube-apiserver's Go profiles at
	// /debug/pprof/, to clients allowed that path (the admin kubeconfig):
	// for finding where the API server's time goes under a benchmark.
	APIServerProfiling bool
	// Log receives progress messages; nil discards them.
	Log *slog.Logger
	// StopTimeout is how long each child gets between SIGTERM and SIGKILL;
	// 0 means 15s.
	StopTimeout time.Duration
}

// ControlPlane is a running control plane. Stop it when done; if the
// process dies first, the kernel kills the children (Pdeathsig) and drops
// the data dir lock.
type ControlPlane struct {
	opts     Options
	dataDir  string
	ports    ports
	pki      *pki
	restCfg  *rest.Config
	lock     *dataDirLock
	spawner  *spawner
	log      *slog.Logger
	children []*child // in start order

	died     chan error
	stopOnce sync.Once
	stopErr  error
}

// Start brings the control plane up in opts.DataDir and returns once the API
// server reports ready and every CRD is Established. ctx bounds the startup
// only (without a deadline, 3 minutes); the processes run until Stop. On any
// failure everything already started is stopped again and the error's
// first line says what went wrong and what to do.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	if opts.DataDir == "" {
		return nil, errors.New("controlplane: no data dir given")
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = 15 * time.Second
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
	}

	bins := []string{Etcd, KubeAPIServer}
	if opts.ControllerManager {
		bins = append(bins, KubeControllerManager)
	}
	binPaths, err := findBinaries(opts.BinDir, bins)
	if err != nil {
		return nil, err
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	if opts.CRDs != nil {
		if crds, err = readCRDs(opts.CRDs); err != nil {
			return nil, err
		}
	}

	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{dataDir, filepath.Join(dataDir, "logs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating data dir: %w", err)
		}
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{
		opts:    opts,
		dataDir: dataDir,
		lock:    lock,
		spawner: newSpawner(),
		log:     log,
		died:    make(chan error, 1),
	}
	defer func() {
		if err != nil {
			_ = cp.Stop()
		}
	}()

	configFile := filepath.Join(dataDir, "config.json")
	if cp.ports, err = choosePorts(configFile, opts.APIServerPort, opts.PreferredAPIServerPort); err != nil {
		return nil, err
	}
	if err := checkPorts(cp.ports, configFile); err != nil {
		return nil, err
	}
	if err := writePorts(configFile, cp.ports); err != nil {
		return nil, err
	}
	if cp.pki, err = ensurePKI(filepath.Join(dataDir, "pki")); err != nil {
		return nil, err
	}
	cp.restCfg = cp.clientConfig(cp.pki.admin)
	if err := cp.writeKubeconfigs(); err != nil {
		return nil, err
	}

	log.Info("starting etcd", "port", cp.ports.EtcdClient)
	etcd, err := cp.startChild(Etcd, binPaths[Etcd], cp.etcdArgs())
	if err != nil {
		return nil, err
	}
	if err := cp.waitFor(ctx, etcd, cp.etcdHealthy); err != nil {
		return nil, err
	}

	log.Info("starting kube-apiserver", "url", cp.restCfg.Host)
	apiserver, err := cp.startChild(KubeAPIServer, binPaths[KubeAPIServer], cp.apiServerArgs())
	if err != nil {
		return nil, err
	}
	if err := cp.waitFor(ctx, apiserver, cp.apiServerReady); err != nil {
		return nil, err
	}

	if opts.ControllerManager {
		log.Info("starting kube-controller-manager")
		if _, err := cp.startChild(KubeControllerManager, binPaths[KubeControllerManager], cp.controllerManagerArgs()); err != nil {
			return nil, err
		}
	}

	if len(crds) > 0 {
		log.Info("installing CRDs", "count", len(crds))
		if err := cp.whileAllRun(ctx, func(ctx context.Context) error { return applyCRDs(ctx, cp.installConfig(), crds) }); err != nil {
			return nil, err
		}
	}
	if opts.KaironAccess {
		log.Info("installing Kairon's RBAC roles and admission policies")
		if err := cp.whileAllRun(ctx, func(ctx context.Context) error { return installAccess(ctx, cp.installConfig()) }); err != nil {
			return nil, err
		}
	}
	log.Info("control plane ready", "kubeconfig", cp.KubeconfigPath())
	return cp, nil
}

// installConfig is the admin config of Start's own requests: over a
// hundred creates, reads, updates and probes in a row on a restart, where
// every object already exists. Under client-go's default limit (5 requests
// a second, bursts of 10) they took some 17 seconds of every restart of
// kairon-local. Like kairon-controller and kairon-node, it sets
// no client-side limit; the API server has nothing else to serve yet.
func (cp *ControlPlane) installConfig() *rest.Config {
	cfg := rest.CopyConfig(cp.restCfg)
	cfg.QPS, cfg.Burst = -1, -1
	return cfg
}

// RESTConfig returns a fresh admin (system:masters) client config.
func (cp *ControlPlane) RESTConfig() *rest.Config { return rest.CopyConfig(cp.restCfg) }

// KubeconfigPath is the admin kubeconfig in the data dir, for kubectl.
func (cp *ControlPlane) KubeconfigPath() string { return filepath.Join(cp.dataDir, "kubeconfig") }

// ControllerKubeconfig is kairon-controller's kubeconfig in the data dir:
// user ControllerUser in group ControllersGroup, which Options.KaironAccess
// binds to the controller's ClusterRole.
func (cp *ControlPlane) ControllerKubeconfig() string { return ControllerKubeconfigPath(cp.dataDir) }

// ControllerKubeconfigPath is where ControllerKubeconfig is in dataDir.
func ControllerKubeconfigPath(dataDir string) string {
	return filepath.Join(dataDir, "kairon-controller.kubeconfig")
}

// NodeKubeconfigPath is where NodeKubeconfig writes node agent nodeName's
// kubeconfig in dataDir.
func NodeKubeconfigPath(dataDir, nodeName string) string {
	return filepath.Join(dataDir, "node-"+nodeName+".kubeconfig")
}

// NodeKubeconfig issues (or keeps, while still good) the client certificate
// of node agent nodeName, user NodeUserPrefix+nodeName in group NodesGroup,
// and writes its kubeconfig into the data dir; it returns the file's path.
// With Options.KaironAccess that identity may write only its own Node, the
// Machines on it and the migrations it takes part in.
func (cp *ControlPlane) NodeKubeconfig(nodeName string) (string, error) {
	if errs := validation.IsDNS1123Subdomain(nodeName); len(errs) > 0 {
		return "", fmt.Errorf("node name %q: %s", nodeName, errs[0])
	}
	kp, err := ensureLeaf(cp.pki.dir, cp.pki.ca, nodeLeafSpec(nodeName))
	if err != nil {
		return "", fmt.Errorf("client certificate of node %s: %w", nodeName, err)
	}
	file := NodeKubeconfigPath(cp.dataDir, nodeName)
	return file, cp.writeKubeconfig(file, NodeUserPrefix+nodeName, kp)
}

// DataDir is the absolute data dir.
func (cp *ControlPlane) DataDir() string { return cp.dataDir }

// Wait delivers one error if a child process exits without Stop having been
// called; the error names the process and ends with the tail of its log.
// The control plane is then broken: call Stop.
func (cp *ControlPlane) Wait() <-chan error { return cp.died }

// Stop terminates the children in reverse start order (SIGTERM to each
// process group, SIGKILL after Options.StopTimeout) and releases the data
// dir. The data itself stays. Stop is safe to call more than once.
func (cp *ControlPlane) Stop() error {
	cp.stopOnce.Do(func() {
		// Once a child has died (etcd, typically), the others tend to hang
		// in their graceful shutdown waiting for it; there is nothing left
		// worth waiting for, so they get a short grace and no complaint.
		grace, broken := cp.opts.StopTimeout, false
		for _, c := range cp.children {
			if c.hasExited() && !c.stopping.Load() {
				grace, broken = min(grace, 3*time.Second), true
			}
		}
		var killed []string
		for i := len(cp.children) - 1; i >= 0; i-- {
			c := cp.children[i]
			cp.log.Info("stopping " + c.name)
			if !c.stop(grace) {
				continue
			}
			if holdsState(c.name) {
				killed = append(killed, c.name)
			} else {
				cp.log.Info(c.name+" did not stop within its grace and was killed; it keeps no state of its own", "grace", grace)
			}
		}
		cp.spawner.close()
		cp.lock.release()
		if len(killed) > 0 && !broken {
			cp.stopErr = fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", strings.Join(killed, ", "), cp.opts.StopTimeout)
		}
	})
	return cp.stopErr
}

// holdsState says whether a control-plane child keeps state a SIGKILL
// could lose: etcd does. The API server and the controller manager keep
// theirs in etcd; on a loaded machine they can outlive their grace (the
// API server drains its requests first), and killing them then loses
// nothing, so it is no failure of the stop.
func holdsState(name string) bool { return name == Etcd }

func findBinaries(dir string, names []string) (map[string]string, error) {
	if dir == "" {
		return nil, fmt.Errorf("no bin dir given: run `make tools` and pass the bin/ it fills")
	}
	paths := map[string]string{}
	var missing []string
	for _, name := range names {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, name)
			continue
		}
		paths[name] = p
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s not found in %s: run `make tools`", strings.Join(missing, ", "), dir)
	}
	return paths, nil
}

func (cp *ControlPlane) startChild(name, bin string, args []string) (*child, error) {
	c, err := startChild(cp.spawner, filepath.Join(cp.dataDir, "logs"), name, bin, args, func(c *child) {
		select {
		case cp.died <- c.exitError():
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	cp.children = append(cp.children, c)
	return c, nil
}

// waitFor polls check until it succeeds. It gives up as soon as any child
// has exited, because then it never will, and shows that child's log.
func (cp *ControlPlane) waitFor(ctx context.Context, c *child, check func(context.Context) error) error {
	var last error
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, other := range cp.children {
			if other.hasExited() {
				return other.exitError()
			}
		}
		checkCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		last = check(checkCtx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not become ready: %v (last check: %v); see %s%s", c.name, ctx.Err(), last, c.logPath, c.tailSection())
		case <-tick.C:
		}
	}
}

// whileAllRun runs f but returns early, with the log, if a child exits.
func (cp *ControlPlane) whileAllRun(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			for _, c := range cp.children {
				if c.hasExited() {
					return c.exitError()
				}
			}
		}
	}
}

func (cp *ControlPlane) etcdURL(port int) string { return "https://127.0.0.1:" + strconv.Itoa(port) }

func (cp *ControlPlane) etcdArgs() []string {
	p := cp.pki.path
	client, peer := cp.etcdURL(cp.ports.EtcdClient), cp.etcdURL(cp.ports.EtcdPeer)
	args := []string{
		"--name=kairon",
		"--data-dir=" + filepath.Join(cp.dataDir, "etcd"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=kairon=" + peer,
		"--initial-cluster-state=new", // ignored once etcd/ has data
		// Mutual TLS even on loopback: other local users must not be able
		// to read Secrets straight out of etcd.
		"--cert-file=" + p("etcd.crt"),
		"--key-file=" + p("etcd.key"),
		"--trusted-ca-file=" + p("ca.crt"),
		"--client-cert-auth=true",
		"--peer-cert-file=" + p("etcd.crt"),
		"--peer-key-file=" + p("etcd.key"),
		"--peer-trusted-ca-file=" + p("ca.crt"),
		"--peer-client-cert-auth=true",
	}
	if cp.opts.EtcdUnsafeNoFsync {
		args = append(args, "--unsafe-no-fsync=true")
	}
	return args
}

func (cp *ControlPlane) etcdHealthy(ctx context.Context) error {
	pool := x509.NewCertPool()
	pool.AddCert(cp.pki.ca.cert)
	cert := tls.Certificate{Certificate: [][]byte{cp.pki.etcdCli.cert.Raw}, PrivateKey: cp.pki.etcdCli.key}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.etcdURL(cp.ports.EtcdClient)+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("etcd /health: %s %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

func (cp *ControlPlane) apiServerArgs() []string {
	p := cp.pki.path
	return []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(cp.ports.APIServer),
		"--tls-cert-file=" + p("apiserver.crt"),
		"--tls-private-key-file=" + p("apiserver.key"),
		"--client-ca-file=" + p("ca.crt"),
		"--etcd-servers=" + cp.etcdURL(cp.ports.EtcdClient),
		"--etcd-cafile=" + p("ca.crt"),
		"--etcd-certfile=" + p("apiserver-etcd-client.crt"),
		"--etcd-keyfile=" + p("apiserver-etcd-client.key"),
		"--authorization-mode=RBAC",
		// Whom the node proxy presents itself as to node agents: a user
		// allowed to read consoles (ConsoleReaderClusterRole), no admin.
		"--kubelet-client-certificate=" + p("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + p("apiserver-kubelet-client.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p("sa.pub"),
		"--service-account-signing-key-file=" + p("sa.key"),
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		// The default reconciler would publish 127.0.0.1 as the endpoint of
		// the "kubernetes" Service, which Endpoints validation rejects as
		// loopback; there are no in-cluster pods that would dial it anyway.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=" + strconv.FormatBool(cp.opts.APIServerProfiling),
	}
}

func (cp *ControlPlane) apiServerReady(ctx context.Context) error {
	cfg := cp.RESTConfig()
	cfg.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		if len(body) > 0 {
			return fmt.Errorf("%v: %s", err, failedChecks(string(body)))
		}
		return err
	}
	return nil
}

func (cp *ControlPlane) controllerManagerArgs() []string {
	p := cp.pki.path
	return []string{
		"--kubeconfig=" + filepath.Join(cp.dataDir, "controller-manager.kubeconfig"),
		"--leader-elect=false",
		"--controllers=" + strings.Join(KCMControllers, ","),
		// Each controller acts as its own service account with its own
		// bootstrap RBAC role; the KCM's own user may only read.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + p("sa.key"),
		"--root-ca-file=" + p("ca.crt"),
		"--secure-port=0",
	}
}

func (cp *ControlPlane) clientConfig(kp *keyPair) *rest.Config {
	return &rest.Config{
		Host: "https://127.0.0.1:" + strconv.Itoa(cp.ports.APIServer),
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   cp.pki.ca.certPEM,
			CertData: kp.certPEM,
			KeyData:  kp.keyPEM,
		},
	}
}

func (cp *ControlPlane) writeKubeconfigs() error {
	for _, k := range []struct {
		file, user string
		kp         *keyPair
	}{
		{cp.KubeconfigPath(), "kairon-admin", cp.pki.admin},
		{filepath.Join(cp.dataDir, "controller-manager.kubeconfig"), "kube-controller-manager", cp.pki.kcm},
		{cp.ControllerKubeconfig(), ControllerUser, cp.pki.controller},
	} {
		if err := cp.writeKubeconfig(k.file, k.user, k.kp); err != nil {
			return err
		}
	}
	return nil
}

func (cp *ControlPlane) writeKubeconfig(file, user string, kp *keyPair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kairon-local"] = &clientcmdapi.Cluster{
		Server:                   cp.restCfg.Host,
		CertificateAuthorityData: cp.pki.ca.certPEM,
	}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.certPEM, ClientKeyData: kp.keyPEM}
	cfg.Contexts["kairon-local"] = &clientcmdapi.Context{Cluster: "kairon-local", AuthInfo: user}
	cfg.CurrentContext = "kairon-local"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(file, data, 0o600); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	return nil
}

// failedChecks picks the "[-]name failed" lines out of a /readyz body.
func failedChecks(body string) string {
	var failed []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "[-]") {
			failed = append(failed, strings.TrimPrefix(l, "[-]"))
		}
	}
	if len(failed) == 0 {
		return strings.TrimSpace(body)
	}
	return strings.Join(failed, "; ")
}

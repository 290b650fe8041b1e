package node

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
)

// Live migration, the node agents' part. kairon-controller picks the target
// and sets the migration Running; then:
//
//  1. the SOURCE agent publishes the hash of a one-time transfer token on
//     the migration (migration_token.go), connects to the target agent's
//     migration endpoint (the Node annotation
//     kairon.zyvor.dev/migration-endpoint, written by kairon-controller;
//     mutual TLS with --migration-tls-dir: both certificates checked
//     against one CA, the target's certificate must name the migration's
//     target node) and asks for the migration by name, with the token;
//  2. the TARGET agent checks that it is the target of that Running live
//     migration, that the peer's certificate names its source node
//     (migration_security.go) and consumes the token, attaches the Machine
//     to its network and answers OK;
//  3. the source's backend streams the running guest (SendLive) while the
//     target's backend loads it (ReceiveLive); the guest runs on the source
//     until the final pass, then on the target;
//  4. the target reads the migration afresh and, still Running, switches
//     the Machine's spec.nodeName to itself and answers DONE; the source annotates the migration state-saved with the downtime
//     its hypervisor measured;
//  5. the controller sees both and marks the migration Succeeded; the source
//     then stops its paused copy (finishSource, shared with cold).
//
// Any failure before the switch marks the migration Failed; the target
// drops what it loaded and the source's guest runs on (QEMU resumes a guest
// whose outgoing migration failed; finishSource resumes it otherwise).
//
// The wire protocol is line based around the backend's stream:
//
//	source: KAIRON-LIVE/2 <namespace> <migration> <token>\n
//	target: OK\n | ERR <why>\n   (ERR refused to a peer not authenticated)
//	source: <backend stream>
//	target: DONE\n | ERR <why>\n
//
// The same listener serves cold migrations' saved states to their target
// (migration_state.go):
//
//	target: KAIRON-STATE/1 <namespace> <migration> <token>\n
//	source: OK <bytes>\n <saved state> | ERR <why>\n
//
// and MachineSnapshots' files to the nodes restoring them
// (machine_snapshot_fetch.go): KAIRON-SNAPSHOT/1.

const (
	liveProtocol = "KAIRON-LIVE/2"
	// stateProtocol asks for a cold migration's saved state.
	stateProtocol = "KAIRON-STATE/1"
	// liveHandshakeTimeout bounds the source's connecting, TLS and the
	// target's first answer (the target's side: migrationHandshakeTimeout).
	liveHandshakeTimeout = 15 * time.Second
	// liveTransferTimeout bounds the stream and the target's answer.
	liveTransferTimeout = 4 * time.Minute
	// liveLineLimit bounds the protocol's lines: a request with a 63-byte
	// namespace and a 253-byte name fits.
	liveLineLimit = 512
)

// migrationTLS is the agents' mutual TLS for live migration, from a
// directory holding tls.crt, tls.key and ca.crt (a kubernetes.io/tls Secret
// with the CA added, as the Helm chart mounts migration.tlsSecretName).
// Each agent has its own certificate naming its node (certNamesNode): the
// target checks the source's after reading the request, the source checks
// the target's during the handshake.
type migrationTLS struct {
	server *tls.Config
	cert   tls.Certificate
	pool   *x509.CertPool
}

func loadMigrationTLS(dir string) (*migrationTLS, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return nil, fmt.Errorf("--migration-tls-dir %s: %w", dir, err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("--migration-tls-dir %s: %w", dir, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("--migration-tls-dir %s: ca.crt holds no PEM certificate", dir)
	}
	return &migrationTLS{
		server: &tls.Config{
			Certificates: []tls.Certificate{cert}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
		},
		cert: cert, pool: pool,
	}, nil
}

// clientFor is the source's TLS towards the agent of node: its certificate
// must chain to the CA and name node.
func (t *migrationTLS) clientFor(node string) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{t.cert}, MinVersion: tls.VersionTLS13,
		// Verified by VerifyConnection: against the CA, and by node name
		// (CN or DNS SAN) rather than by the address dialled.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the target agent sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{
				Roots: t.pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			}); err != nil {
				return err
			}
			if !certNamesNode(leaf, node) {
				return fmt.Errorf("the agent's certificate (%s) is not node %s's", certIdentity(leaf), node)
			}
			return nil
		},
	}
}

// migrationPort is what the Node annotation migration-port advertises: the
// listener's port, "" when there is no listener or it may not serve.
func (a *Agent) migrationPort() string {
	if a.migrationListener == nil || a.checkMigrationTransport() != nil {
		return ""
	}
	_, port, err := net.SplitHostPort(a.migrationListener.Addr().String())
	if err != nil {
		return ""
	}
	return port
}

// checkMigrationTransport is CheckMigrationTransport for this agent's
// listener.
func (a *Agent) checkMigrationTransport() error {
	tlsDir := ""
	if a.migrationTLS != nil {
		tlsDir = a.opts.MigrationTLSDir
	}
	return CheckMigrationTransport(a.migrationListener.Addr().String(), tlsDir, a.opts.MigrationInsecure)
}

// serveLiveMigrations accepts live migrations until ctx ends. It refuses to
// start in plain TCP (checkMigrationTransport).
func (a *Agent) serveLiveMigrations(ctx context.Context) error {
	if err := a.checkMigrationTransport(); err != nil {
		_ = a.migrationListener.Close()
		return err
	}
	go func() {
		<-ctx.Done()
		_ = a.migrationListener.Close()
	}()
	// Connections not yet authenticated hold a slot; when all are taken a
	// new connection is closed at once.
	slots := make(chan struct{}, a.migrationMaxHandshakes())
	for {
		conn, err := a.migrationListener.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("migration listener: %w", err)
		}
		select {
		case slots <- struct{}{}:
			go a.receiveLive(ctx, conn, slots)
		default:
			log.FromContext(ctx).Info("live migration connection dropped: too many handshakes in progress", "peer", conn.RemoteAddr().String())
			_ = conn.Close()
		}
	}
}

// receiveLive is the target's side of one live migration connection. It
// holds one of slots until the peer is authenticated.
func (a *Agent) receiveLive(ctx context.Context, conn net.Conn, slots <-chan struct{}) {
	defer conn.Close()
	held := true
	release := func() {
		if held {
			held = false
			<-slots
		}
	}
	defer release()
	logger := log.FromContext(ctx).WithValues("peer", conn.RemoteAddr().String())
	_ = conn.SetDeadline(time.Now().Add(a.migrationHandshakeTimeout()))
	var peer *x509.Certificate
	if a.migrationTLS != nil {
		tc := tls.Server(conn, a.migrationTLS.server)
		if err := tc.HandshakeContext(ctx); err != nil {
			logger.Info("live migration refused: TLS handshake failed", "err", err.Error())
			return
		}
		peer = tc.ConnectionState().PeerCertificates[0]
		conn = tc
	}
	in := bufio.NewReader(conn)
	line, err := readLine(in)
	if err != nil {
		logger.Info("live migration refused: no request", "err", err.Error())
		return
	}
	request, err := parseMigrationRequest(line)
	if err != nil {
		logger.Info("migration connection refused", "why", err.Error())
		_ = reply(conn, liveRefused)
		return
	}
	key := request.key
	logger = logger.WithValues("migration", key.String())
	if request.protocol == stateProtocol {
		a.sendSavedState(log.IntoContext(ctx, logger), conn, request, peer, release)
		return
	}
	if request.protocol == snapshotProtocol {
		a.sendSnapshot(log.IntoContext(ctx, logger), conn, request, peer, release)
		return
	}
	if request.protocol == templateProtocol {
		a.sendTemplate(log.IntoContext(ctx, logger), conn, request, peer, release)
		return
	}
	mig, err := a.checkLiveTarget(ctx, key)
	if err == nil && peer != nil && !certNamesNode(peer, mig.Status.SourceNode) {
		err = fmt.Errorf("the peer's certificate (%s) is not the source node %s's", certIdentity(peer), mig.Status.SourceNode)
	}
	if err == nil {
		// Last: a peer that fails the checks above does not use up the
		// source's token.
		mig, err = a.consumeTransferToken(ctx, mig, request.token)
	}
	if err != nil {
		// Not (yet) known as the migration's source: it learns nothing, and
		// the migration is left alone (the source fails it if it was the
		// source, misconfigured).
		logger.Info("live migration refused", "why", err.Error())
		_ = reply(conn, liveRefused)
		return
	}
	release() // the peer is the migration's source (or nothing checks: --migration-insecure)
	if _, busy := a.receiving.LoadOrStore(key, true); busy {
		reply(conn, "ERR node "+a.opts.NodeName+" is already receiving migration "+key.String())
		return
	}
	defer a.receiving.Delete(key)
	machine, spec, err := a.prepareLiveTarget(ctx, mig)
	if err != nil {
		logger.Info("live migration refused", "why", err.Error())
		reply(conn, "ERR "+err.Error())
		return
	}
	id := spec.ID
	if err := reply(conn, "OK"); err != nil {
		_ = a.teardown(ctx, id)
		return
	}
	transfer := max(liveTransferTimeout, liveOptions(mig.Status.MigrationPolicy).CompletionTimeout+liveHandshakeTimeout)
	_ = conn.SetDeadline(time.Now().Add(transfer))

	receiveCtx, cancel := context.WithTimeout(ctx, transfer)
	defer cancel()
	began := time.Now()
	_, err = a.opts.Backend.(backend.LiveMigrator).ReceiveLive(receiveCtx, spec, in)
	if err == nil {
		err = a.switchToThisNode(ctx, machine, mig)
	}
	if err != nil {
		_ = a.teardown(ctx, id)
		msg := fmt.Sprintf("receiving the guest on node %s: %v", a.opts.NodeName, err)
		_ = reply(conn, "ERR "+msg)
		if failErr := a.failMigration(ctx, mig, kaironv1.MigrationReasonReceiveFailed, msg); failErr != nil && !apierrors.IsConflict(failErr) {
			logger.Error(failErr, "marking the migration failed")
		}
		return
	}
	logger.Info("guest received; Machine switched to this node", "took", time.Since(began))
	_ = reply(conn, "DONE")
}

// checkLiveTarget reads the migration key afresh and checks that it is a
// Running live migration to this node.
func (a *Agent) checkLiveTarget(ctx context.Context, key client.ObjectKey) (*kaironv1.MachineMigration, error) {
	mig := &kaironv1.MachineMigration{}
	if err := a.mgr.GetAPIReader().Get(ctx, key, mig); err != nil {
		return nil, fmt.Errorf("reading migration %s: %w", key, err)
	}
	switch {
	case mig.Spec.Strategy != kaironv1.MigrationLive:
		return nil, fmt.Errorf("migration %s is not live", key)
	case mig.Status.Phase != kaironv1.MigrationRunning:
		return nil, fmt.Errorf("migration %s is %q, not Running", key, mig.Status.Phase)
	case mig.Status.TargetNode != a.opts.NodeName:
		return nil, fmt.Errorf("migration %s targets node %q, not %s", key, mig.Status.TargetNode, a.opts.NodeName)
	case mig.Status.SourceNode == "":
		return nil, fmt.Errorf("migration %s has no source node", key)
	}
	return mig, nil
}

// prepareLiveTarget checks the Machine of the Running live migration mig
// (checkLiveTarget) and attaches it to the node network.
func (a *Agent) prepareLiveTarget(ctx context.Context, mig *kaironv1.MachineMigration) (*kaironv1.Machine, backend.Spec, error) {
	reader := a.mgr.GetAPIReader()
	if _, ok := a.opts.Backend.(backend.LiveMigrator); !ok {
		return nil, backend.Spec{}, fmt.Errorf("the %s backend of node %s cannot receive live migrations", a.opts.Backend.Name(), a.opts.NodeName)
	}
	machine := &kaironv1.Machine{}
	if err := reader.Get(ctx, client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}, machine); err != nil {
		return nil, backend.Spec{}, fmt.Errorf("reading machine %s/%s: %w", mig.Namespace, mig.Spec.MachineName, err)
	}
	if machine.Spec.NodeName != mig.Status.SourceNode || !machine.DeletionTimestamp.IsZero() {
		return nil, backend.Spec{}, fmt.Errorf("machine %s is on node %q or being deleted, not on the source %s", machine.Name, machine.Spec.NodeName, mig.Status.SourceNode)
	}
	id := instanceID(machine.Namespace, machine.Name)
	if _, err := a.opts.Backend.Get(ctx, id); !errors.Is(err, backend.ErrNotFound) {
		return nil, backend.Spec{}, fmt.Errorf("node %s already holds a VM for machine %s", a.opts.NodeName, machine.Name)
	}
	// The guest's image before anything of the VM: the source's guest
	// keeps running meanwhile.
	if err := a.awaitImage(ctx, machine); err != nil {
		return nil, backend.Spec{}, err
	}
	spec, err := a.attach(machine, id)
	if err != nil {
		_ = a.teardown(ctx, id)
		return nil, backend.Spec{}, fmt.Errorf("attaching to the network of node %s: %w", a.opts.NodeName, err)
	}
	return machine, spec, nil
}

// switchToThisNode moves the Machine's spec.nodeName from the migration's
// source to this node: the moment a migration commits. It never overrides
// another change, and it switches only while the migration, read afresh
// from the API server, is still this Running migration (not cancelled,
// failed or replaced meanwhile).
func (a *Agent) switchToThisNode(ctx context.Context, machine *kaironv1.Machine, mig *kaironv1.MachineMigration) error {
	key := client.ObjectKeyFromObject(machine)
	source := mig.Status.SourceNode
	switched := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current := &kaironv1.Machine{}
		if err := a.mgr.GetAPIReader().Get(ctx, key, current); err != nil {
			return err
		}
		if current.Spec.NodeName == a.opts.NodeName {
			return nil
		}
		if current.Spec.NodeName != source {
			return fmt.Errorf("machine %s moved to node %q meanwhile", key.Name, current.Spec.NodeName)
		}
		// Read last, just before the patch (whose optimistic lock covers
		// the Machine, not the migration).
		fresh := &kaironv1.MachineMigration{}
		if err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(mig), fresh); err != nil {
			return fmt.Errorf("not switching machine %s: reading migration %s: %w", key.Name, mig.Name, err)
		}
		switch {
		case fresh.UID != mig.UID || fresh.Status.SourceNode != source || fresh.Status.TargetNode != a.opts.NodeName:
			return fmt.Errorf("not switching machine %s: migration %s was replaced meanwhile", key.Name, mig.Name)
		case fresh.Status.Phase != kaironv1.MigrationRunning:
			return fmt.Errorf("not switching machine %s: migration %s is %q, not Running", key.Name, mig.Name, fresh.Status.Phase)
		}
		base := current.DeepCopy()
		current.Spec.NodeName = a.opts.NodeName
		if err := a.client.Patch(ctx, current, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return err
		}
		machine, switched = current, true
		return nil
	})
	if switched {
		strategy := mig.Spec.Strategy
		if strategy == "" {
			strategy = kaironv1.MigrationCold
		}
		a.event(machine, corev1.EventTypeNormal, kaironv1.EventReasonMigrated, fmt.Sprintf("moved from node %s to node %s (%s, migration %s)", source, a.opts.NodeName, strategy, mig.Name))
	}
	return err
}

// migrateSourceLive is the source's side of a live migration.
func (a *Agent) migrateSourceLive(ctx context.Context, mig *kaironv1.MachineMigration) (reconcile.Result, error) {
	id := instanceID(mig.Namespace, mig.Spec.MachineName)
	// The marker file records that a send began, for finishSource and for
	// an agent restarted in the middle of one.
	marker := a.migrationStatePath(mig.Namespace, mig.Name)
	if mig.Status.Phase.IsTerminal() {
		return reconcile.Result{}, a.releaseSource(ctx, mig)
	}
	if mig.Status.Phase != kaironv1.MigrationRunning || mig.Annotations[kaironv1.AnnotationMigrationStateSaved] == "true" {
		return reconcile.Result{}, nil
	}
	machine := &kaironv1.Machine{}
	if err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}, machine); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if _, err := os.Stat(marker); err == nil {
		// A send began before and its outcome was not recorded.
		if machine.Spec.NodeName == mig.Status.TargetNode {
			return reconcile.Result{}, a.recordHandOver(ctx, mig, unknownDowntime)
		}
		return reconcile.Result{}, a.failMigration(ctx, mig, kaironv1.MigrationReasonTransferInterrupted,
			fmt.Sprintf("the live migration from node %s was interrupted (agent restarted?); the guest stays there", a.opts.NodeName))
	}
	if machine.Spec.NodeName != a.opts.NodeName {
		return reconcile.Result{}, nil
	}
	migrator, ok := a.opts.Backend.(backend.LiveMigrator)
	if !ok {
		return reconcile.Result{}, a.failMigration(ctx, mig, kaironv1.MigrationReasonLiveNotSupported,
			fmt.Sprintf("the %s backend of node %s cannot migrate a running guest; use strategy cold", a.opts.Backend.Name(), a.opts.NodeName))
	}
	if err := a.holdAsSource(ctx, mig); err != nil {
		return reconcile.Result{}, err
	}
	if err := os.MkdirAll(filepath.Dir(marker), 0o700); err != nil {
		return reconcile.Result{}, err
	}
	if err := os.WriteFile(marker, []byte("live\n"), 0o600); err != nil {
		return reconcile.Result{}, err
	}
	downtime, reason, err := a.sendLive(ctx, mig, id, migrator)
	if err != nil {
		if reason == "" { // unclear outcome: the Machine's node tells
			current := &kaironv1.Machine{}
			if getErr := a.mgr.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(machine), current); getErr == nil && current.Spec.NodeName == mig.Status.TargetNode {
				return reconcile.Result{}, a.recordHandOver(ctx, mig, unknownDowntime)
			}
			reason = kaironv1.MigrationReasonTransferInterrupted
		}
		return reconcile.Result{}, a.failMigration(ctx, mig, reason, err.Error())
	}
	log.FromContext(ctx).Info("guest migrated live", "migration", klog.KObj(mig), "target", klog.KRef("", mig.Status.TargetNode), "downtime", downtime)
	return reconcile.Result{}, a.recordHandOver(ctx, mig, downtime)
}

// sendLive connects to the target agent and streams the guest. A failure
// comes with the migration's reason, or "" when the outcome is unknown (the
// connection broke after the whole stream was sent).
func (a *Agent) sendLive(ctx context.Context, mig *kaironv1.MachineMigration, id string, migrator backend.LiveMigrator) (time.Duration, kaironv1.MigrationReason, error) {
	target := mig.Status.TargetNode
	token, err := a.publishTransferToken(ctx, mig)
	if err != nil {
		return 0, kaironv1.MigrationReasonTargetUnreachable, err
	}
	conn, err := a.dialLive(ctx, target)
	if err != nil {
		return 0, kaironv1.MigrationReasonTargetUnreachable, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(liveHandshakeTimeout))
	if err := reply(conn, fmt.Sprintf("%s %s %s %s", liveProtocol, mig.Namespace, mig.Name, token)); err != nil {
		return 0, kaironv1.MigrationReasonTargetUnreachable, fmt.Errorf("node %s: %w", target, err)
	}
	in := bufio.NewReader(conn)
	answer, err := readLine(in)
	if err != nil {
		return 0, kaironv1.MigrationReasonTargetUnreachable, fmt.Errorf("node %s did not answer: %w", target, err)
	}
	if answer != "OK" {
		return 0, kaironv1.MigrationReasonTargetRefused, fmt.Errorf("node %s refused the guest: %s", target, strings.TrimPrefix(answer, "ERR "))
	}
	opts := liveOptions(mig.Status.MigrationPolicy)
	transfer := max(liveTransferTimeout, opts.CompletionTimeout+liveHandshakeTimeout)
	_ = conn.SetDeadline(time.Now().Add(transfer))
	sendCtx, cancel := context.WithTimeout(ctx, transfer)
	defer cancel()
	downtime, err := migrator.SendLive(sendCtx, id, conn, opts)
	if reason := policyReason(err); reason != "" {
		err = fmt.Errorf("live migration from node %s to node %s cancelled under MigrationPolicy %s: %w; the guest keeps running on %s",
			a.opts.NodeName, target, mig.Status.MigrationPolicy.Name, err, a.opts.NodeName)
		// Recorded before the connection closes: the target, seeing the
		// stream end, would record its ReceiveFailed otherwise.
		if failErr := a.failMigration(ctx, mig, reason, err.Error()); failErr != nil {
			log.FromContext(ctx).Error(failErr, "marking the migration failed", "migration", klog.KObj(mig))
		}
		return 0, reason, err
	}
	if err != nil {
		// The target explains a failure on its side better than a broken pipe.
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		if answer, readErr := readLine(in); readErr == nil && strings.HasPrefix(answer, "ERR ") {
			return 0, kaironv1.MigrationReasonReceiveFailed, errors.New(strings.TrimPrefix(answer, "ERR "))
		}
		return 0, kaironv1.MigrationReasonTransferFailed, fmt.Errorf("streaming the guest from node %s to node %s: %w; it keeps running on %s", a.opts.NodeName, target, err, a.opts.NodeName)
	}
	answer, err = readLine(in)
	switch {
	case err != nil:
		return 0, "", fmt.Errorf("node %s did not confirm the migration: %w", target, err)
	case answer != "DONE":
		return 0, kaironv1.MigrationReasonReceiveFailed, errors.New(strings.TrimPrefix(answer, "ERR "))
	}
	return downtime, "", nil
}

// liveOptions are the backend's options for a live migration under the
// MigrationPolicy kairon-controller recorded on it (nil: none, defaults).
func liveOptions(p *kaironv1.AppliedMigrationPolicy) backend.LiveOptions {
	var opts backend.LiveOptions
	if p == nil {
		return opts
	}
	if p.BandwidthPerMigration != nil {
		opts.MaxBandwidth = p.BandwidthPerMigration.Value()
	}
	if p.AllowAutoConverge != nil {
		opts.AutoConverge = *p.AllowAutoConverge
	}
	if p.CompletionTimeoutSeconds != nil {
		opts.CompletionTimeout = time.Duration(*p.CompletionTimeoutSeconds) * time.Second
	}
	if p.ProgressTimeoutSeconds != nil {
		opts.ProgressTimeout = time.Duration(*p.ProgressTimeoutSeconds) * time.Second
	}
	return opts
}

// policyReason is the migration's reason for a SendLive error that says
// the backend cancelled it under its policy's timeouts, else "".
func policyReason(err error) kaironv1.MigrationReason {
	switch {
	case errors.Is(err, backend.ErrMigrationNoProgress):
		return kaironv1.MigrationReasonNoProgress
	case errors.Is(err, backend.ErrMigrationCompletionTimeout):
		return kaironv1.MigrationReasonCompletionTimeout
	}
	return ""
}

// dialLive connects to a node's migration endpoint, with TLS if configured.
func (a *Agent) dialLive(ctx context.Context, nodeName string) (net.Conn, error) {
	node := &corev1.Node{}
	if err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
		return nil, fmt.Errorf("reading node %s: %w", nodeName, err)
	}
	endpoint := node.Annotations[kaironv1.AnnotationNodeMigrationEndpoint]
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return nil, fmt.Errorf("node %s advertises no live migration endpoint (annotation %s %q): is its agent started with --migration-listen?",
			nodeName, kaironv1.AnnotationNodeMigrationEndpoint, endpoint)
	}
	if host == "" {
		for _, addr := range node.Status.Addresses {
			if addr.Type == corev1.NodeInternalIP {
				host = addr.Address
				break
			}
		}
		if host == "" {
			return nil, fmt.Errorf("node %s has no InternalIP for its migration endpoint %q", nodeName, endpoint)
		}
	}
	dialCtx, cancel := context.WithTimeout(ctx, liveHandshakeTimeout)
	defer cancel()
	address := net.JoinHostPort(host, port)
	conn, err := (&net.Dialer{}).DialContext(dialCtx, "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("connecting to node %s at %s: %w", nodeName, address, err)
	}
	if a.migrationTLS == nil {
		if !a.opts.MigrationInsecure && !isLoopbackHost(host) {
			conn.Close()
			return nil, fmt.Errorf("not sending a guest to node %s at %s in plain TCP: this agent has no --migration-tls-dir (--migration-insecure allows it, for tests)", nodeName, address)
		}
		return conn, nil
	}
	tc := tls.Client(conn, a.migrationTLS.clientFor(nodeName))
	if err := tc.HandshakeContext(dialCtx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("TLS with node %s at %s: %w", nodeName, address, err)
	}
	return tc, nil
}

// unknownDowntime is the downtime of a hand-over the source only learnt of
// afterwards (from the Machine's node), without the hypervisor's measure.
const unknownDowntime = time.Duration(-1)

// recordHandOver annotates the migration once the target took the guest
// over, for the controller to finish it, with the downtime the source's
// hypervisor measured (0 is a measure: less than a millisecond).
func (a *Agent) recordHandOver(ctx context.Context, mig *kaironv1.MachineMigration, downtime time.Duration) error {
	base := mig.DeepCopy()
	if mig.Annotations == nil {
		mig.Annotations = map[string]string{}
	}
	mig.Annotations[kaironv1.AnnotationMigrationStateSaved] = "true"
	mig.Annotations[kaironv1.AnnotationMigrationStateSavedAt] = time.Now().Add(-max(downtime, 0)).UTC().Format(time.RFC3339Nano)
	if downtime >= 0 {
		mig.Annotations[kaironv1.AnnotationMigrationDowntimeMillis] = strconv.FormatInt(downtime.Milliseconds(), 10)
	}
	return a.client.Patch(ctx, mig, client.MergeFrom(base))
}

// readLine reads one protocol line without its newline.
func readLine(r *bufio.Reader) (string, error) {
	var line []byte
	for {
		b, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		if b == '\n' {
			return string(line), nil
		}
		if len(line) >= liveLineLimit {
			return "", errors.New("protocol line too long")
		}
		line = append(line, b)
	}
}

// reply writes one protocol line.
func reply(w io.Writer, line string) error {
	_, err := io.WriteString(w, strings.ReplaceAll(line, "\n", " ")+"\n")
	return err
}

package node

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Cold migrations' saved states travel over the migration listener, not
// the console port (issue 10, finding 3): the target agent connects to the
// source agent's migration endpoint, mutual TLS checks that each is the
// migration's other node, and the target presents a one-time token. The
// console port, which the API server's node proxy and console readers
// reach, serves no state, and a cluster where agents are reached through
// the kubelet's port needs nothing but the migration listener.

// stateRefusal is the listener's one answer to a state request it does not
// serve: the peer learns nothing about why.
const stateRefusal = liveRefused

// sendSavedState is the source's side of a state request on the migration
// listener. release gives the handshake slot back once the peer is known
// to be the migration's target.
func (a *Agent) sendSavedState(ctx context.Context, conn net.Conn, request migrationRequest, peer *x509.Certificate, release func()) {
	logger := log.FromContext(ctx)
	mig, err := a.checkStateSource(ctx, request.key)
	if err == nil && a.migrationTLS != nil && !certNamesNode(peer, mig.Status.TargetNode) {
		err = fmt.Errorf("the peer's certificate (%s) is not the target node %s's", certIdentity(peer), mig.Status.TargetNode)
	}
	if err == nil {
		mig, err = a.consumeTransferToken(ctx, mig, request.token)
	}
	if err != nil {
		logger.Info("saved state refused", "why", err.Error())
		_ = reply(conn, stateRefusal)
		return
	}
	release()
	file, size, err := a.openSavedState(mig.Namespace, mig.Name)
	if err != nil {
		logger.Info("saved state not sent", "why", err.Error())
		_ = reply(conn, "ERR "+err.Error())
		return
	}
	defer file.Close()
	_ = conn.SetDeadline(time.Now().Add(liveTransferTimeout))
	if err := reply(conn, "OK "+strconv.FormatInt(size, 10)); err != nil {
		return
	}
	began := time.Now()
	if _, err := io.CopyN(conn, file, size); err != nil {
		logger.Info("sending the saved state broke off", "err", err.Error())
		return
	}
	logger.Info("saved state sent to the target", "bytes", size, "took", time.Since(began))
}

// checkStateSource reads migration key afresh and checks that this node is
// the source of that Running cold migration and has saved the guest.
func (a *Agent) checkStateSource(ctx context.Context, key client.ObjectKey) (*kaironv1.MachineMigration, error) {
	mig := &kaironv1.MachineMigration{}
	if err := a.mgr.GetAPIReader().Get(ctx, key, mig); err != nil {
		return nil, fmt.Errorf("reading migration %s: %w", key, err)
	}
	switch {
	case !isCold(mig):
		return nil, fmt.Errorf("migration %s is not cold", key)
	case mig.Status.Phase != kaironv1.MigrationRunning:
		return nil, fmt.Errorf("migration %s is %q, not Running", key, mig.Status.Phase)
	case mig.Status.SourceNode != a.opts.NodeName:
		return nil, fmt.Errorf("migration %s comes from node %q, not %s", key, mig.Status.SourceNode, a.opts.NodeName)
	case mig.Status.TargetNode == "":
		return nil, fmt.Errorf("migration %s has no target node", key)
	case mig.Annotations[kaironv1.AnnotationMigrationStateSaved] != "true":
		return nil, fmt.Errorf("migration %s: the guest is not saved yet", key)
	}
	return mig, nil
}

// openSavedState opens the saved state of migration ns/name and returns
// its size when opened, refusing one larger than its header declares
// (stateLimit).
func (a *Agent) openSavedState(ns, name string) (*os.File, int64, error) {
	file, err := os.Open(a.migrationStatePath(ns, name))
	if err != nil {
		return nil, 0, fmt.Errorf("no saved state for migration %s/%s on node %s", ns, name, a.opts.NodeName)
	}
	info, err := file.Stat()
	if err != nil || !info.Mode().IsRegular() {
		file.Close()
		return nil, 0, errors.New("saved state unreadable")
	}
	size := info.Size()
	head := make([]byte, stateHeaderSize)
	n, _ := io.ReadFull(file, head)
	if memMiB, ok := declaredMemoryMiB(head[:n]); ok && size > stateLimit(memMiB) {
		file.Close()
		return nil, 0, errStateTooLarge(stateLimit(memMiB))
	}
	if _, err := file.Seek(0, io.SeekStart); err != nil {
		file.Close()
		return nil, 0, errors.New("saved state unreadable")
	}
	return file, size, nil
}

// fetchState downloads the saved VM from the source agent's migration
// listener to path, presenting a fresh one-time token.
func (a *Agent) fetchState(ctx context.Context, mig *kaironv1.MachineMigration, path string) error {
	source := mig.Status.SourceNode
	token, err := a.publishTransferToken(ctx, mig)
	if err != nil {
		return err
	}
	conn, err := a.dialLive(ctx, source)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(liveHandshakeTimeout))
	if err := reply(conn, fmt.Sprintf("%s %s %s %s", stateProtocol, mig.Namespace, mig.Name, token)); err != nil {
		return fmt.Errorf("node %s: %w", source, err)
	}
	in := bufio.NewReader(conn)
	answer, err := readLine(in)
	if err != nil {
		return fmt.Errorf("node %s did not answer: %w", source, err)
	}
	size, err := parseStateAnswer(answer)
	if err != nil {
		return fmt.Errorf("node %s: %w", source, err)
	}
	// The source is not trusted to bound what it sends: the download stops
	// at the size it announced, and that must be within the limit of the
	// Machine's memory (from the API server) or of the smaller memory the
	// state's header declares.
	limit, err := a.stateLimitOf(ctx, mig)
	if err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(liveTransferTimeout))
	return saveStateDownload(path, io.LimitReader(in, size), size, limit, source)
}

// parseStateAnswer reads the source's answer to a state request: "OK
// <bytes>" gives the state's size; anything else is a refusal, quoted
// sanitized.
func parseStateAnswer(answer string) (int64, error) {
	text, ok := strings.CutPrefix(answer, "OK ")
	if !ok {
		return 0, fmt.Errorf("refused the saved state: %s", sanitizeGuestText(strings.TrimPrefix(answer, "ERR ")))
	}
	size, err := strconv.ParseInt(text, 10, 64)
	if err != nil || size < 0 {
		return 0, errors.New("announced a malformed saved state size")
	}
	return size, nil
}

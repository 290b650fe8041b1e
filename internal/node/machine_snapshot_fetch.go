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
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Restoring a snapshot of another store: the node the snapshot was taken
// on still has the file, and the restoring node fetches it over the
// migration listener, as a cold migration's target fetches the saved
// state (migration_state.go):
//
//	target: KAIRON-SNAPSHOT/1 <namespace> <snapshot> <unused token>\n
//	owner:  OK <bytes>\n <state file> | ERR <why>\n
//
// The owner serves a snapshot only over mutual TLS (or with
// --migration-insecure, for tests), only one it took into its own store,
// and only to a node whose certificate names it and on which a Machine
// restored from that snapshot is placed. The copy is kept in
// StateDir/fetched-snapshots until its snapshot is deleted (the sweep),
// so starting that Machine again does not fetch it again.

// snapshotProtocol asks for a MachineSnapshot's state file.
const snapshotProtocol = "KAIRON-SNAPSHOT/1"

func (a *Agent) fetchedSnapshotDir() string {
	return filepath.Join(a.opts.StateDir, "fetched-snapshots")
}

// fetchSnapshot downloads snap's file from the node that took it into
// fetchedSnapshotDir and returns the local copy.
func (a *Agent) fetchSnapshot(ctx context.Context, snap *kaironv1.MachineSnapshot, machine *kaironv1.Machine) (string, error) {
	path := filepath.Join(a.fetchedSnapshotDir(), filepath.Base(snap.Status.File))
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	owner := snap.Status.Node
	conn, err := a.dialLive(ctx, owner)
	if err != nil {
		return "", fmt.Errorf("fetching MachineSnapshot %s from node %s: %w", snap.Name, owner, err)
	}
	defer conn.Close()
	// The owner authenticates this node by its certificate; the request
	// keeps the listener's four-field form with a token it does not use.
	token, _, err := newTransferToken()
	if err != nil {
		return "", err
	}
	_ = conn.SetDeadline(time.Now().Add(liveHandshakeTimeout))
	if err := reply(conn, fmt.Sprintf("%s %s %s %s", snapshotProtocol, snap.Namespace, snap.Name, token)); err != nil {
		return "", fmt.Errorf("node %s: %w", owner, err)
	}
	in := bufio.NewReader(conn)
	answer, err := readLine(in)
	if err != nil {
		return "", fmt.Errorf("node %s did not answer for MachineSnapshot %s: %w", owner, snap.Name, err)
	}
	size, err := parseStateAnswer(answer)
	if err != nil {
		return "", fmt.Errorf("node %s, MachineSnapshot %s: %w", owner, snap.Name, err)
	}
	memMiB := machine.Spec.Memory.Value() >> 20
	if memMiB <= 0 {
		memMiB = 256
	}
	began := time.Now()
	_ = conn.SetDeadline(time.Now().Add(liveTransferTimeout))
	if err := saveStateDownload(path, io.LimitReader(in, size), size, stateLimit(memMiB), owner); err != nil {
		return "", err
	}
	log.FromContext(ctx).Info("fetched snapshot from its node", "machinesnapshot", klog.KObj(snap), "node", owner, "bytes", size, "took", time.Since(began))
	return path, nil
}

// sendSnapshot is the owner's side of a snapshot request.
func (a *Agent) sendSnapshot(ctx context.Context, conn net.Conn, request migrationRequest, peer *x509.Certificate, release func()) {
	a.serveStateRequest(ctx, conn, "snapshot", request, func() (string, error) { return a.checkSnapshotRequest(ctx, request.key, peer) }, release)
}

// serveStateRequest is the owner's side of a request for a saved state
// file, a MachineSnapshot's or a pool template's (what): check says
// whether the peer may have it and where it is; then the listener is
// released and the file sent.
func (a *Agent) serveStateRequest(ctx context.Context, conn net.Conn, what string, request migrationRequest, check func() (string, error), release func()) {
	logger := log.FromContext(ctx)
	path, err := check()
	if err != nil {
		logger.Info(what+" request refused", "why", err.Error())
		_ = reply(conn, stateRefusal)
		return
	}
	release()
	if size, err := a.sendStateFile(conn, path); err != nil {
		logger.Info("sending a "+what+" broke off", "err", err.Error())
	} else {
		logger.Info(what+" sent", "object", request.key.String(), "bytes", size)
	}
}

// sendStateFile answers an allowed request for the state file at path:
// "OK <bytes>" and the file, or "ERR" if it cannot be read. It is shared
// with the template fetch (template_fetch.go).
func (a *Agent) sendStateFile(conn net.Conn, path string) (int64, error) {
	file, err := os.Open(path)
	if err != nil {
		_ = reply(conn, "ERR the state file is not readable on node "+a.opts.NodeName)
		return 0, err
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil || !info.Mode().IsRegular() {
		_ = reply(conn, "ERR the state file is not readable on node "+a.opts.NodeName)
		return 0, fmt.Errorf("%s is not a readable regular file", path)
	}
	_ = conn.SetDeadline(time.Now().Add(liveTransferTimeout))
	if err := reply(conn, "OK "+strconv.FormatInt(info.Size(), 10)); err != nil {
		return 0, err
	}
	if _, err := io.CopyN(conn, file, info.Size()); err != nil {
		return 0, err
	}
	return info.Size(), nil
}

// checkSnapshotRequest says whether the peer may have snapshot key's file
// and returns it: a snapshot this node took into its own store, asked for
// by a node (its certificate names it) on which a Machine restored from it
// is placed. Without mutual TLS the peer is unknown, and only
// --migration-insecure lets the request through (tests).
func (a *Agent) checkSnapshotRequest(ctx context.Context, key client.ObjectKey, peer *x509.Certificate) (string, error) {
	if a.migrationTLS == nil && !a.opts.MigrationInsecure {
		return "", errors.New("snapshots are served over mutual TLS only (--migration-tls-dir)")
	}
	snap := &kaironv1.MachineSnapshot{}
	if err := a.mgr.GetAPIReader().Get(ctx, key, snap); err != nil {
		return "", fmt.Errorf("reading MachineSnapshot %s: %w", key, err)
	}
	switch {
	case snap.Status.Phase != kaironv1.SnapshotReady:
		return "", fmt.Errorf("MachineSnapshot %s is not Ready", key)
	case snap.Status.Node != a.opts.NodeName || snap.Status.Store != a.opts.SnapshotStore:
		return "", fmt.Errorf("MachineSnapshot %s was not taken into this node's store", key)
	}
	var machines kaironv1.MachineList
	if err := a.mgr.GetAPIReader().List(ctx, &machines, client.InNamespace(key.Namespace)); err != nil {
		return "", err
	}
	for _, m := range machines.Items {
		if m.Spec.RestoreFrom == nil || m.Spec.RestoreFrom.SnapshotName != key.Name || m.Spec.NodeName == "" || m.Spec.NodeName == a.opts.NodeName {
			continue
		}
		if peer == nil || certNamesNode(peer, m.Spec.NodeName) {
			return filepath.Join(a.opts.SnapshotDir, filepath.Base(snap.Status.File)), nil
		}
	}
	return "", fmt.Errorf("no Machine restored from MachineSnapshot %s is placed on the peer's node (%s)", key, certIdentity(peer))
}

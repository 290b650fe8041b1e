package node

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Snapshot clones on any node. A pool's clone may be placed on a node other
// than its template Machine's; that node fetches the template's state file
// from the template's node over the migration listener, as a MachineSnapshot
// of another store is fetched (machine_snapshot_fetch.go):
//
//	clone's node:    KAIRON-TEMPLATE/1 <namespace> <template machine> <unused token>\n
//	template's node: OK <bytes>\n <state file> | ERR <why>\n
//
// The template's node serves only over mutual TLS (or with
// --migration-insecure, for tests), only the file of a template Machine it
// saved itself, and only to a node whose certificate names it and on which
// a clone of that template is placed. The clone's node checks the copy
// against the template's status.snapshot (its size, and its SHA-256 when
// the template was saved with one) before it uses it, and keeps it in
// StateDir/fetched-templates, named after the template and that version, so
// the next clone of the template on this node does not fetch it again; the
// clones being started at once share one fetch. A copy goes when its
// template Machine is gone (the template changed, or the pool went away) or
// was saved anew (the sweep below).

// templateProtocol asks for a template Machine's state file.
const templateProtocol = "KAIRON-TEMPLATE/1"

// templateSweepInterval is how often an agent looks for fetched template
// copies whose template is gone. A copy is as large as the guest's memory,
// so it goes sooner than a MachineSnapshot's (snapshotSweepInterval); a
// look costs one read per copy, and nothing without copies.
const templateSweepInterval = 15 * time.Second

func (a *Agent) fetchedTemplateDir() string {
	return filepath.Join(a.opts.StateDir, "fetched-templates")
}

// templateVersion names one save of a template: its digest, or for a
// template saved without one, its time and size.
func templateVersion(snap *kaironv1.TemplateSnapshot) string {
	if snap.SHA256 != "" {
		return snap.SHA256[:min(16, len(snap.SHA256))]
	}
	return fmt.Sprintf("%d-%d", snap.SavedAt.Unix(), snap.SizeBytes)
}

// templateCopyName is the file name of a fetched copy:
// <namespace>_<template>.<version>.state. A namespace has no "_" and a
// version no ".", so the name parses back (parseTemplateCopyName).
func templateCopyName(namespace, template string, snap *kaironv1.TemplateSnapshot) string {
	return instanceID(namespace, template) + "." + templateVersion(snap) + ".state"
}

func parseTemplateCopyName(name string) (namespace, template, version string, ok bool) {
	rest, ok := strings.CutSuffix(name, ".state")
	if !ok {
		return "", "", "", false
	}
	dot := strings.LastIndexByte(rest, '.')
	if dot < 0 {
		return "", "", "", false
	}
	namespace, template, ok = strings.Cut(rest[:dot], "_")
	version = rest[dot+1:]
	return namespace, template, version, ok && namespace != "" && template != "" && version != ""
}

// templateStateFor returns the state file clone is restored from: the
// template's own file if it was saved on this node, otherwise a copy
// fetched from the template's node. Errors that can pass (the template not
// saved yet, its node unreachable, a copy that does not check out) are
// transient, so the start is retried.
func (a *Agent) templateStateFor(ctx context.Context, clone *kaironv1.Machine, template string) (string, error) {
	local := a.snapshotPath(instanceID(clone.Namespace, template))
	_, statErr := os.Stat(local)
	if statErr == nil {
		return local, nil
	}
	tm := &kaironv1.Machine{}
	// Not the cache: it holds this node's Machines only.
	if err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKey{Namespace: clone.Namespace, Name: template}, tm); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("annotation %s: template Machine %s not found", kaironv1.AnnotationRestoreFrom, template)
		}
		return "", transient(err)
	}
	snap := tm.Status.Snapshot
	switch {
	case snap == nil || tm.Spec.NodeName == "":
		return "", transient(fmt.Errorf("template Machine %s is not saved yet", template))
	case tm.Spec.NodeName == a.opts.NodeName:
		return "", fmt.Errorf("the snapshot of template Machine %s is not on node %s, which saved it: %w", template, a.opts.NodeName, statErr)
	}
	path := filepath.Join(a.fetchedTemplateDir(), templateCopyName(tm.Namespace, tm.Name, snap))
	err := templateFetches.do(path, func() error {
		if _, err := os.Stat(path); err == nil {
			return nil // fetched for an earlier clone
		}
		return a.fetchTemplate(ctx, tm, clone, path)
	})
	if err != nil {
		return "", transient(err)
	}
	return path, nil
}

// fetchTemplate downloads template Machine tm's state file from its node to
// path and checks it against tm's status.snapshot.
func (a *Agent) fetchTemplate(ctx context.Context, tm, clone *kaironv1.Machine, path string) error {
	owner, snap := tm.Spec.NodeName, tm.Status.Snapshot
	conn, err := a.dialLive(ctx, owner)
	if err != nil {
		return fmt.Errorf("fetching the snapshot of template Machine %s from node %s: %w", tm.Name, owner, err)
	}
	defer conn.Close()
	// The owner authenticates this node by its certificate; the request
	// keeps the listener's four-field form with a token it does not use.
	token, _, err := newTransferToken()
	if err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(liveHandshakeTimeout))
	if err := reply(conn, fmt.Sprintf("%s %s %s %s", templateProtocol, tm.Namespace, tm.Name, token)); err != nil {
		return fmt.Errorf("node %s: %w", owner, err)
	}
	in := bufio.NewReader(conn)
	answer, err := readLine(in)
	if err != nil {
		return fmt.Errorf("node %s did not answer for template Machine %s: %w", owner, tm.Name, err)
	}
	size, err := parseStateAnswer(answer)
	if err != nil {
		return fmt.Errorf("node %s, template Machine %s: %w", owner, tm.Name, err)
	}
	if size != snap.SizeBytes {
		return fmt.Errorf("node %s offers %d bytes for template Machine %s, whose status.snapshot.sizeBytes is %d", owner, size, tm.Name, snap.SizeBytes)
	}
	memMiB := clone.Spec.Memory.Value() >> 20
	if memMiB <= 0 {
		memory := defaultMachineMemory()
		memMiB = memory.Value() >> 20
	}
	began := time.Now()
	_ = conn.SetDeadline(time.Now().Add(liveTransferTimeout))
	digest := sha256.New()
	unchecked := path + ".unchecked"
	if err := saveStateDownload(unchecked, io.TeeReader(io.LimitReader(in, size), digest), size, stateLimit(memMiB), owner); err != nil {
		return err
	}
	if got := hex.EncodeToString(digest.Sum(nil)); snap.SHA256 != "" && got != snap.SHA256 {
		_ = os.Remove(unchecked)
		return fmt.Errorf("the copy of template Machine %s from node %s has SHA-256 %s, its status.snapshot.sha256 is %s", tm.Name, owner, got, snap.SHA256)
	}
	if err := os.Rename(unchecked, path); err != nil {
		_ = os.Remove(unchecked)
		return err
	}
	log.FromContext(ctx).Info("fetched template snapshot from its node", "template", klog.KObj(tm), "node", owner, "bytes", size, "took", time.Since(began))
	return nil
}

// sendTemplate is the template node's side of a template request.
func (a *Agent) sendTemplate(ctx context.Context, conn net.Conn, request migrationRequest, peer *x509.Certificate, release func()) {
	a.serveStateRequest(ctx, conn, "template snapshot", request, func() (string, error) { return a.checkTemplateRequest(ctx, request.key, peer) }, release)
}

// checkTemplateRequest says whether the peer may have template Machine
// key's state file and returns it: a template this node saved, asked for by
// a node (its certificate names it) on which a clone of it is placed.
// Without mutual TLS the peer is unknown, and only --migration-insecure
// lets the request through (tests).
func (a *Agent) checkTemplateRequest(ctx context.Context, key client.ObjectKey, peer *x509.Certificate) (string, error) {
	if a.migrationTLS == nil && !a.opts.MigrationInsecure {
		return "", errors.New("template snapshots are served over mutual TLS only (--migration-tls-dir)")
	}
	tm := &kaironv1.Machine{}
	if err := a.mgr.GetAPIReader().Get(ctx, key, tm); err != nil {
		return "", fmt.Errorf("reading template Machine %s: %w", key, err)
	}
	path := a.snapshotPath(instanceID(key.Namespace, key.Name))
	switch {
	case tm.Annotations[kaironv1.AnnotationSnapshotSave] == "" || tm.Status.Snapshot == nil:
		return "", fmt.Errorf("machine %s is no saved template", key)
	case tm.Spec.NodeName != a.opts.NodeName || tm.Status.Snapshot.Path != path:
		return "", fmt.Errorf("template Machine %s was not saved on this node", key)
	}
	var machines kaironv1.MachineList
	if err := a.mgr.GetAPIReader().List(ctx, &machines, client.InNamespace(key.Namespace)); err != nil {
		return "", err
	}
	for _, m := range machines.Items {
		if m.Annotations[kaironv1.AnnotationRestoreFrom] != key.Name || m.Spec.NodeName == "" || m.Spec.NodeName == a.opts.NodeName {
			continue
		}
		if peer == nil || certNamesNode(peer, m.Spec.NodeName) {
			return path, nil
		}
	}
	return "", fmt.Errorf("no clone of template Machine %s is placed on the peer's node (%s)", key, certIdentity(peer))
}

// sweepTemplateCopies deletes, every templateSweepInterval, the fetched
// template copies whose template is gone or was saved anew.
func (a *Agent) sweepTemplateCopies(ctx context.Context) error {
	ticker := time.NewTicker(templateSweepInterval)
	defer ticker.Stop()
	for {
		if err := a.sweepTemplateCopyFiles(ctx); err != nil {
			log.FromContext(ctx).Error(err, "sweeping fetched template snapshots")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

func (a *Agent) sweepTemplateCopyFiles(ctx context.Context) error {
	dir := a.fetchedTemplateDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		namespace, template, version, ok := parseTemplateCopyName(e.Name())
		if !ok {
			// A download in progress (.tmp, .unchecked), or one an agent
			// that stopped left behind.
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > snapshotPartialAge && !templateFetches.busy(strings.TrimSuffix(strings.TrimSuffix(path, ".tmp"), ".unchecked")) {
				errs = append(errs, removeIfThere(path))
			}
			continue
		}
		tm := &kaironv1.Machine{}
		err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKey{Namespace: namespace, Name: template}, tm)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			errs = append(errs, err)
			continue
		case tm.Status.Snapshot != nil && templateVersion(tm.Status.Snapshot) == version:
			continue // still the template's
		}
		if err := removeIfThere(path); err != nil {
			errs = append(errs, err)
			continue
		}
		log.FromContext(ctx).Info("deleted fetched template snapshot", "template", namespace+"/"+template, "file", path)
	}
	return errors.Join(errs...)
}

func removeIfThere(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// templateFetches shares one fetch of a template's state file among the
// clones started at once. Its keys are paths below an agent's state
// directory, so agents in one process (tests, kairon-local) share nothing.
var templateFetches inFlight

// inFlight lets concurrent callers with one key share one run of a
// function: the first runs it, the others wait for its result.
type inFlight struct {
	mu    sync.Mutex
	calls map[string]*inFlightCall
}

type inFlightCall struct {
	done chan struct{}
	err  error
	// waiters is how many callers wait for this run.
	waiters int
}

func (f *inFlight) do(key string, fn func() error) error {
	f.mu.Lock()
	if c, ok := f.calls[key]; ok {
		c.waiters++
		f.mu.Unlock()
		<-c.done
		return c.err
	}
	if f.calls == nil {
		f.calls = map[string]*inFlightCall{}
	}
	c := &inFlightCall{done: make(chan struct{})}
	f.calls[key] = c
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.calls, key)
		f.mu.Unlock()
		close(c.done)
	}()
	c.err = fn()
	return c.err
}

func (f *inFlight) busy(key string) bool {
	return f.waiting(key) >= 0
}

// waiting is how many callers wait for key's run; -1 if none runs.
func (f *inFlight) waiting(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.calls[key]; ok {
		return c.waiters
	}
	return -1
}

// fileSHA256 is the hex SHA-256 digest of the file at path.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

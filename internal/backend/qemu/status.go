package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

// What a VM is doing, as Get and List report it: read from its state
// directory and the process table, and from QEMU over QMP when no operation
// holds the VM.

// consoleTailLines is how much of the console an Exited instance carries.
const consoleTailLines = 20

// Get implements backend.Backend.
func (b *Backend) Get(ctx context.Context, id string) (backend.Instance, error) {
	if err := validID(id); err != nil {
		return backend.Instance{}, backend.ErrNotFound
	}
	return b.get(ctx, id, b.vm(id), true)
}

// List implements backend.Backend.
func (b *Backend) List(ctx context.Context) ([]backend.Instance, error) {
	ents, err := os.ReadDir(b.opts.StateDir)
	if err != nil {
		return nil, err
	}
	var out []backend.Instance
	for _, e := range ents {
		if !e.IsDir() || validID(e.Name()) != nil {
			continue
		}
		inst, err := b.get(ctx, e.Name(), b.vm(e.Name()), true)
		if errors.Is(err, backend.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, inst)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// get builds the instance from disk and the process table. useQMP asks QEMU
// for its run state unless an operation holds the VM.
func (b *Backend) get(ctx context.Context, id string, v *vmState, useQMP bool) (backend.Instance, error) {
	dir := b.dir(id)
	m, err := readMeta(dir)
	if err != nil {
		return backend.Instance{}, err
	}
	inst := backend.Instance{
		ID: id, Name: m.Spec.Name, PID: m.PID, StartedAt: m.StartedAt, Acceleration: m.Acceleration,
	}
	if inst.PID == 0 {
		inst.PID = readPIDFile(filepath.Join(dir, pidFile))
	}
	v.mu.Lock()
	p := v.proc
	v.mu.Unlock()
	if p != nil && p.pid != inst.PID {
		p = nil
	}
	if inst.PID == 0 || !processAlive(inst.PID, dir) {
		if p != nil { // our child: let reap record the exact status
			select {
			case <-p.exited:
			case <-time.After(time.Second):
			}
		}
		inst.Phase = backend.Exited
		inst.Reason = exitReason(dir, inst.PID, p)
		inst.ConsoleTail = lastLines(readTail(filepath.Join(dir, consoleLogFile), 16*1024), consoleTailLines)
		return inst, nil
	}
	// Every Get and List comes here, so this is where a VM this Backend did
	// not start (one adopted after an agent restart) gets its console guard.
	guardConsole(dir)

	var rr readyRecord
	ready := readJSON(filepath.Join(dir, readyFile), &rr) == nil
	// A VM an operation of this Backend holds is not adopted: a start
	// launches QEMU before it records the process as its own, and an
	// adoption's watcher then configured a clone alongside the start.
	adopted := p == nil && !v.busy.Load()
	if !ready && adopted && m.AgentPort {
		// No watcher of ours (an adopted VM): start one.
		b.watchAdopted(id, m)
	} else if !ready && adopted && !m.AgentPort {
		// An adopted VM without the agent's port: look for the marker now and
		// take the log's last write as the moment it appeared.
		var sc markerScanner
		if found, _ := sc.scan(filepath.Join(dir, consoleLogFile)); found {
			rr = readyRecord{ReadyAfter: sc.mtime.Sub(m.StartedAt), At: sc.mtime}
			_ = writeJSON(filepath.Join(dir, readyFile), rr)
			ready = true
		}
	}
	if ready {
		inst.ReadyAfter = rr.ReadyAfter
	}
	running := true
	_, err = os.Stat(filepath.Join(dir, pausedFile))
	paused := err == nil
	status := ""
	if useQMP && !v.busy.Load() {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		var st qmpStatus
		err := qmpDo(qctx, filepath.Join(dir, qmpSock), func(q *qmpConn) error { var err error; st, err = q.status(); return err })
		cancel()
		if err == nil {
			status, running, paused = st.Status, st.Running, !st.Running
		}
	}
	switch status {
	case "internal-error", "guest-panicked", "shutdown", "io-error", "watchdog":
		inst.Phase = backend.Exited
		inst.Reason = "QEMU stopped the VM: status " + status + " (process still runs)"
		inst.ConsoleTail = lastLines(readTail(filepath.Join(dir, consoleLogFile), 16*1024), consoleTailLines)
		return inst, nil
	}
	switch {
	case paused || !running:
		inst.Phase = backend.Paused
	case ready:
		inst.Phase = backend.Running
	default:
		inst.Phase = backend.Booting
	}
	return inst, nil
}

// exitReason explains why a VM's process is gone.
func exitReason(dir string, pid int, p *proc) string {
	var er exitRecord
	if readJSON(filepath.Join(dir, exitFile), &er) == nil && er.PID == pid {
		return er.Reason
	}
	if p != nil {
		select {
		case <-p.exited:
			return p.exitDesc()
		default:
		}
	}
	// Not our child (the agent restarted since): QEMU's own last words and
	// the console are all there is.
	qlog := readTail(filepath.Join(dir, qemuLogFile), 8192)
	if m := kvmFailure.FindString(qlog); m != "" {
		return "qemu stopped: " + strings.TrimSpace(m)
	}
	if i := strings.LastIndex(qlog, "terminating on signal"); i >= 0 {
		line, _, _ := strings.Cut(qlog[i:], "\n")
		return "qemu " + strings.TrimSpace(line)
	}
	console := readTail(filepath.Join(dir, consoleLogFile), 16*1024)
	switch {
	case strings.Contains(console, "Kernel panic"):
		return "qemu exited after the guest kernel panicked"
	case strings.Contains(console, "reboot: Power down"), strings.Contains(console, "reboot: System halted"):
		return "qemu exited: the guest powered off"
	case strings.Contains(console, "reboot: Restarting system"):
		return "qemu exited: the guest rebooted (VMs run with -no-reboot)"
	}
	// A jailed QEMU killed for its cgroup's memory cap says nothing: its
	// cgroup, which outlives it until Stop, tells.
	var jr jailRecord
	if readJSON(filepath.Join(dir, jailFile), &jr) == nil {
		if kills, limit, ok := memoryOOM(jr.Cgroups); ok && kills > 0 {
			return oomKilledDesc(limit)
		}
	}
	if l := lastLines(qlog, 1); l != "" {
		return fmt.Sprintf("qemu process %d is gone (exit status unknown to this agent); its last output: %s", pid, l)
	}
	return fmt.Sprintf("qemu process %d is gone without a word: killed (SIGKILL or the OOM killer) or crashed; exit status unknown to this agent", pid)
}

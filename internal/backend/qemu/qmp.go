package qemu

// A minimal QMP client. We use our own rather than
// github.com/digitalocean/go-qemu because the backend needs only seven
// commands, one short-lived connection per operation (so that a restarted
// agent, or an operator with socat, never fights a long-lived connection for
// QEMU's single QMP session), per-call deadlines, and passing a file
// descriptor with getfd (SCM_RIGHTS) for Save; that is about 150 lines here
// against a dependency tree of generated QAPI bindings.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// qmpTimeout bounds one QMP conversation when the caller's context has no
// earlier deadline, in nanoseconds. A variable only for tests, and atomic:
// a test shortens it while the watchers of an earlier test's VMs may still
// be talking to their monitors.
var qmpTimeout atomic.Int64

func init() { qmpTimeout.Store(int64(5 * time.Second)) }

// qmpIDs numbers the commands this process sends, across connections.
var qmpIDs atomic.Uint64

type qmpConn struct {
	c  *net.UnixConn
	rd *bufio.Reader
}

// qmpError is an error QEMU answered a command with.
type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qmpError) Error() string { return "qmp: " + e.Class + ": " + e.Desc }

// dialQMP connects to the QMP socket at path, reads the greeting and leaves
// capabilities negotiation done.
func dialQMP(ctx context.Context, path string) (*qmpConn, error) {
	deadline, ok := ctx.Deadline()
	if limit := time.Duration(qmpTimeout.Load()); !ok || time.Until(deadline) > limit {
		deadline = time.Now().Add(limit)
	}
	// QEMU's monitor takes one client at a time, with a backlog of one:
	// while another QMP connection of this process (a status query, a
	// save) is open, a second connect finds the backlog full and fails
	// with EAGAIN at once. It is tried again until the deadline.
	raw, err := dialUnix(path, time.Until(deadline))
	for errors.Is(err, syscall.EAGAIN) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		raw, err = dialUnix(path, time.Until(deadline))
	}
	if err != nil {
		return nil, err
	}
	q := &qmpConn{c: raw, rd: bufio.NewReader(raw)}
	_ = raw.SetDeadline(deadline)
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	line, err := q.rd.ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &greeting)
	}
	if err == nil && greeting.QMP == nil {
		err = fmt.Errorf("unexpected greeting %q", line)
	}
	if err == nil {
		_, err = q.execute("qmp_capabilities", nil)
		if negotiatedAlready(err) {
			// Seen once in a dozen restores on a loaded host: the monitor
			// left negotiation mode before this client asked (a reconnect
			// right after another client hung up). What negotiation is for
			// is done; the connection takes commands.
			err = nil
		}
	}
	if err != nil {
		raw.Close()
		return nil, fmt.Errorf("qmp %s: %w", path, err)
	}
	return q, nil
}

// dialUnix connects to a unix socket. Paths longer than sun_path allows
// (108 bytes) are reached through /proc/self/fd/N of their directory.
func dialUnix(path string, timeout time.Duration) (*net.UnixConn, error) {
	addr := path
	if len(path) >= 100 {
		dir, err := os.Open(filepath.Dir(path))
		if err != nil {
			return nil, err
		}
		defer dir.Close()
		addr = fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("unix", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// negotiatedAlready tells QEMU's answer to qmp_capabilities on a monitor
// already in command mode.
func negotiatedAlready(err error) bool {
	var qe *qmpError
	return errors.As(err, &qe) && qe.Class == "CommandNotFound" && strings.Contains(qe.Desc, "negotiation is already complete")
}

func (q *qmpConn) Close() error { return q.c.Close() }

// execute runs one command and returns its "return" value, skipping the
// asynchronous events QEMU interleaves.
func (q *qmpConn) execute(cmd string, args any) (json.RawMessage, error) {
	return q.executeWithFile(cmd, args, nil)
}

// executeWithFile sends f's descriptor along with the command (for getfd).
func (q *qmpConn) executeWithFile(cmd string, args any, f *os.File) (json.RawMessage, error) {
	// Every command carries an id of its own, and a reply with another
	// id is skipped: a conversation that timed out while QEMU was busy
	// (finishRestore asks again) can have its reply delivered after the
	// next client connected, which would otherwise answer that client's
	// next command.
	id := fmt.Sprintf("kairon-%d", qmpIDs.Add(1))
	req := map[string]any{"execute": cmd, "id": id}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	b = append(b, '\n')
	if f != nil {
		oob := syscall.UnixRights(int(f.Fd()))
		if _, _, err := q.c.WriteMsgUnix(b, oob, nil); err != nil {
			return nil, err
		}
	} else if _, err := q.c.Write(b); err != nil {
		return nil, err
	}
	for {
		line, err := q.rd.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *qmpError       `json:"error"`
			Event  string          `json:"event"`
			ID     *string         `json:"id"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("%s: bad reply %q: %w", cmd, line, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.ID != nil && *resp.ID != id:
			continue // an earlier conversation's
		case resp.Error != nil:
			return nil, resp.Error
		case resp.Return != nil:
			return resp.Return, nil
		}
	}
}

// qmpStatus is query-status's answer.
type qmpStatus struct {
	Status  string `json:"status"`
	Running bool   `json:"running"`
}

func (q *qmpConn) status() (qmpStatus, error) {
	var st qmpStatus
	raw, err := q.execute("query-status", nil)
	if err == nil {
		err = json.Unmarshal(raw, &st)
	}
	return st, err
}

// qmpMigration is query-migrate's answer (the parts we read).
type qmpMigration struct {
	Status    string `json:"status"`
	ErrorDesc string `json:"error-desc"`
	// Downtime is how long the guest was stopped, in milliseconds, once
	// the migration completed.
	Downtime int64 `json:"downtime"`
	// RAM is the progress of the RAM part, while active or after.
	RAM *qmpMigrationRAM `json:"ram,omitempty"`
}

// qmpMigrationRAM is query-migrate's ram object (the parts we read).
type qmpMigrationRAM struct {
	// Remaining is how many bytes of dirty RAM are left to send.
	Remaining int64 `json:"remaining"`
	// Transferred is how many bytes were sent so far.
	Transferred int64 `json:"transferred"`
}

func (q *qmpConn) migration() (qmpMigration, error) {
	var m qmpMigration
	raw, err := q.execute("query-migrate", nil)
	if err == nil {
		err = json.Unmarshal(raw, &m)
	}
	return m, err
}

// qmpDo opens a connection, runs fn and closes it.
func qmpDo(ctx context.Context, sock string, fn func(*qmpConn) error) error {
	q, err := dialQMP(ctx, sock)
	if err != nil {
		return err
	}
	defer q.Close()
	return fn(q)
}

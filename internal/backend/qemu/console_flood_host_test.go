package qemu

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/guestagent/client"
	"github.com/zyvor/kairon/internal/guestagent/wire"
	"github.com/zyvor/kairon/internal/testenv"
)

// The GiB flood of issue #42, in a time make test can afford. Under TCG the
// guest's UART carries a few hundred KiB/s at most (see consoleFloodBytes),
// so a GiB printed by the guest itself takes hours. A guest under KVM, or
// with a faster console, prints far faster, and all that reaches the node
// is QEMU appending to console.log through its O_APPEND descriptor. So the
// bytes of this test's GiB come from the host side of the same log: the
// test opens the running VM's console.log with O_APPEND, as QEMU does, and
// appends to it at a paced rate, while the guest floods its own serial line
// beside it and the VM's real guard cuts the log.
const (
	// hostFloodBytes is what the test appends to the log: the report's GiB.
	hostFloodBytes = 1 << 30
	// hostFloodChunk is the size of one append (QEMU's appends are a byte
	// each; larger ones only make the log grow in bigger steps, which the
	// bound below counts).
	hostFloodChunk = 64 << 10
	// hostFloodCatchUp is the most the writer sends beyond its pace, back
	// to back, after a stall (blocked while the guard collapses the log, or
	// descheduled): without it a loaded host would slow the GiB down.
	hostFloodCatchUp = 512 << 10
	// hostFloodPerGuardInterval is what the writer appends in one guard
	// interval at its pace: a fifth of the cap, so 16 MiB/s with the 8 MiB
	// cap and the 100 ms interval, and the GiB takes about a minute.
	hostFloodPerGuardInterval = defaultConsoleLogCap / 5
	// guestFloodPerGuardInterval is what the guest's UART can add in one
	// interval: 64 KiB, over twice what its fastest measured rate (279
	// KiB/s) carries in 100 ms.
	guestFloodPerGuardInterval = 64 << 10
	// guardLateIntervals is how late, in guard intervals, a guard's look
	// may come on a loaded two-core host (the guard's goroutine waits for a
	// core, or its previous cut was still flushing the log) before the test
	// calls the guard too slow. Seen here: over one interval late, at a
	// load of 8.
	guardLateIntervals = 2
	// hostFloodLogBound is the largest the log may be seen at. The guard
	// looks every consoleGuardInterval and cuts a log past the cap to half
	// of it, so the log outgrows the cap only by what the writers append
	// after a look that saw it within the cap and before the next one: one
	// interval's worth, one more for each interval that look comes late,
	// and the writer's catch-up and the chunk it is writing:
	// cap + (1+guardLateIntervals)·(host + guest per interval) + catch-up +
	// chunk, about 13.6 MiB. A log nobody cuts passes it within a second.
	hostFloodLogBound = defaultConsoleLogCap + (1+guardLateIntervals)*(hostFloodPerGuardInterval+guestFloodPerGuardInterval) +
		hostFloodCatchUp + hostFloodChunk
	// hostFloodDiskBound is the most disk the log may take (st_blocks): the
	// size bound, plus room for the file system's block rounding and extent
	// blocks.
	hostFloodDiskBound = hostFloodLogBound + 1<<20
)

// hostFloodRate is the writer's pace, in bytes a second, derived from the
// guard's interval.
var hostFloodRate = float64(hostFloodPerGuardInterval) / consoleGuardInterval.Seconds()

// A GiB appended to a running VM's console log from the host, through an
// O_APPEND descriptor as QEMU writes it, while the guest floods its serial
// console at full speed beside it, with the real 8 MiB cap and the VM's
// real guard. Throughout, the log's size and its disk use stay within the
// cap plus what the writers append between two looks of the guard, one of
// them up to two intervals late (hostFloodLogBound), and
// QEMU's monitor and the guest agent answer (an exec, not only a ping).
// After it, the log is under the cap and ends with the last bytes written,
// and neither QEMU's memory nor this process's heap (the agent's guard runs
// in it) grew with the flood. QEMU does not carry the host's bytes: its
// share of the flood is the guest's, which TestConsoleFloodStaysCapped
// drives on its own.
func TestConsoleFloodGiBFromHostBesideGuest(t *testing.T) {
	if got := consoleLogCap.Load(); got != defaultConsoleLogCap {
		t.Fatalf("the console log cap is %d, want the default %d", got, defaultConsoleLogCap)
	}
	b := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	spec := backend.Spec{ID: "ns1_gibflood", Name: "ns1/gibflood", CPU: 1, MemoryMiB: 128}
	inst, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, spec.ID, backend.Running, bootTimeout)
	if _, guarded := consoleGuards.Load(b.dir(spec.ID)); !guarded {
		t.Fatalf("no console guard runs for %s", spec.ID)
	}
	c := dialAgent(t, b, spec.ID)
	logPath := b.ConsoleLog(spec.ID)

	txBefore := uartTX(t, c)
	rssBefore := vmRSS(t, inst.PID)
	heapBefore := heapInUse()

	// The guest floods its console without end, until the test kills it.
	guestDone := make(chan error, 1)
	go func() {
		script := fmt.Sprintf("echo $$ >/tmp/flood.pid; exec yes 'kairon guest flood %s' >/dev/ttyS0", strings.Repeat("g", 50))
		_, err := c.Exec(ctx, &wire.Exec{Args: []string{"sh", "-c", script}}, nil, io.Discard, io.Discard)
		guestDone <- err
	}()
	testenv.Eventually(t, 30*time.Second, "the guest's flood to start", func() (bool, string) {
		sent := uartTX(t, c) - txBefore
		return sent >= 4<<10, fmt.Sprintf("%d bytes sent", sent)
	})

	// The watcher stats the log as fast as it can and stops the flood at the
	// first look past a bound.
	nominal := time.Duration(float64(hostFloodBytes) / hostFloodRate * float64(time.Second))
	fctx, stopFlood := context.WithTimeout(ctx, 3*nominal)
	defer stopFlood()
	w := &logWatcher{path: logPath, sizeBound: hostFloodLogBound, diskBound: hostFloodDiskBound, overrun: stopFlood}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); w.run(wctx) }()

	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := hostFloodLines(hostFloodChunk)
	type result struct {
		written int64
		err     error
	}
	floodDone := make(chan result, 1)
	start := time.Now()
	go func() {
		n, err := pacedAppend(fctx, f, chunk, hostFloodBytes, hostFloodRate, hostFloodCatchUp)
		floodDone <- result{n, err}
	}()

	// While it floods: QEMU's monitor answers, and the guest agent runs a
	// command, over and over.
	checks := 0
	var r result
	for waiting := true; waiting; {
		select {
		case r = <-floodDone:
			waiting = false
		case <-time.After(500 * time.Millisecond):
		}
		if err := vmAnswers(ctx, b, spec.ID, c, checks); err != nil {
			t.Fatalf("after %s of flood: %v", time.Since(start).Round(time.Second), err)
		}
		checks++
	}
	took := time.Since(start)
	if over := w.overrun1(); over != "" {
		t.Fatalf("with %d MiB appended after %s: %s", r.written>>20, took.Round(time.Millisecond), over)
	}
	if r.err != nil {
		t.Fatalf("the host's flood: %v after %d MiB in %s (deadline %s)", r.err, r.written>>20, took.Round(time.Second), 3*nominal)
	}
	if r.written < hostFloodBytes {
		t.Fatalf("appended %d bytes, fewer than %d", r.written, hostFloodBytes)
	}

	// The guest's flood stops; once it is gone, its end marker follows
	// whatever its UART still held.
	guestSent := uartTX(t, c) - txBefore
	stop := "p=$(cat /tmp/flood.pid); kill $p; while kill -0 $p 2>/dev/null; do :; done; echo KAIRON-GUEST-FLOOD-END >/dev/ttyS0; echo ended"
	if _, out, _ := guestExec(t, c, nil, "sh", "-c", stop); out != "ended\n" {
		t.Fatalf("ending the guest's flood: %q", out)
	}
	if err := <-guestDone; err != nil {
		t.Fatalf("the guest's flood: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, "the guest's end marker in the log", func() (bool, string) {
		tail := readTail(logPath, 64<<10)
		return strings.Contains(tail, "KAIRON-GUEST-FLOOD-END"), lastLines(tail, 2)
	})

	// The host's last bytes: one more chunk, ending with a marker of its own.
	last := hostFloodLines(hostFloodChunk)
	copy(last[len(last)-len("KAIRON-HOST-FLOOD-END\n"):], "KAIRON-HOST-FLOOD-END\n")
	if _, err := f.Write(last); err != nil {
		t.Fatal(err)
	}
	written := r.written + int64(len(last))
	testenv.Eventually(t, 10*time.Second, "the log within its cap, ending with the last bytes written", func() (bool, string) {
		fi, err := os.Stat(logPath)
		if err != nil {
			return false, err.Error()
		}
		tail := readTail(logPath, int64(len(last)))
		return fi.Size() <= defaultConsoleLogCap && tail == string(last), fmt.Sprintf("%d bytes, ending %q", fi.Size(), lastLines(tail, 2))
	})
	stopWatch()
	<-watchDone
	if over := w.overrun1(); over != "" {
		t.Fatalf("after the flood: %s", over)
	}
	if blocks := diskUse(t, logPath); blocks > defaultConsoleLogCap+1<<20 {
		t.Errorf("after the flood the log takes %d bytes of disk, past its cap %d", blocks, defaultConsoleLogCap)
	}
	t.Logf("appended %d MiB to the log from the host in %s (%.1f MiB/s, paced at %.0f MiB/s); the guest printed %d KiB beside it (%.0f KiB/s)",
		written>>20, took.Round(time.Millisecond), float64(r.written)/(1<<20)/took.Seconds(), hostFloodRate/(1<<20),
		guestSent>>10, float64(guestSent)/1024/took.Seconds())
	t.Logf("the log peaked at %d bytes and %d bytes of disk (bounds %d and %d, cap %d); %d cuts seen; %d checks of QMP and the agent during it",
		w.maxSize, w.maxDisk, hostFloodLogBound, hostFloodDiskBound, defaultConsoleLogCap, w.cuts, checks)
	// Each cut leaves half the cap, so a GiB takes one per half cap.
	if want := int64(hostFloodBytes / defaultConsoleLogCap); int64(w.cuts) < want {
		t.Errorf("saw the log cut %d times over the GiB, want at least %d", w.cuts, want)
	}
	if guestSent < 64<<10 {
		t.Errorf("the guest printed only %d bytes beside the host's flood", guestSent)
	}

	// After: everything still answers.
	if err := vmAnswers(ctx, b, spec.ID, c, checks); err != nil {
		t.Fatalf("after the flood: %v", err)
	}
	if got, err := b.Get(ctx, spec.ID); err != nil || got.Phase != backend.Running || got.PID != inst.PID {
		t.Errorf("after the flood: %+v %v", got, err)
	}
	// Nothing kept what went through: QEMU's resident memory and this
	// process's heap grew by far less than the flood.
	rssGrowth := vmRSS(t, inst.PID) - rssBefore
	heapGrowth := heapInUse() - heapBefore
	t.Logf("growth over the flood: qemu's RSS %d KiB, the agent's heap %d KiB", rssGrowth>>10, heapGrowth>>10)
	if limit := int64(32 << 20); rssGrowth > limit || heapGrowth > limit {
		t.Errorf("over a flood of %d MiB, qemu's RSS grew by %d KiB and the agent's heap by %d KiB, want each under %d KiB",
			written>>20, rssGrowth>>10, heapGrowth>>10, limit>>10)
	}
}

// vmAnswers checks that QEMU's monitor reports the VM running and that the
// guest agent runs a command (check numbers it).
func vmAnswers(ctx context.Context, b *Backend, id string, c *client.Client, check int) error {
	qctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var st qmpStatus
	err := qmpDo(qctx, b.QMPSocket(id), func(q *qmpConn) error {
		var err error
		st, err = q.status()
		return err
	})
	if err != nil {
		return fmt.Errorf("QEMU's monitor: %w", err)
	}
	if st.Status != "running" {
		return fmt.Errorf("QEMU's monitor reports %q", st.Status)
	}
	var out bytes.Buffer
	want := fmt.Sprintf("check %d\n", check)
	res, err := c.Exec(qctx, &wire.Exec{Args: []string{"echo", "check", fmt.Sprint(check)}}, nil, &out, io.Discard)
	if err != nil || res.Code != 0 || out.String() != want {
		return fmt.Errorf("the guest agent's exec: %+v %q %v", res, out.String(), err)
	}
	return nil
}

// hostFloodLines is n bytes of console-like lines, 80 bytes each (the last
// one cut short where n is not a multiple).
func hostFloodLines(n int) []byte {
	line := "kairon host flood " + strings.Repeat("h", 61) + "\n"
	buf := bytes.Repeat([]byte(line), n/len(line)+1)[:n]
	buf[n-1] = '\n'
	return buf
}

// pacedAppend writes chunk to f until it wrote total bytes, at no more than
// rate bytes a second, plus catchUp: the pace is a schedule, a chunk every
// len(chunk)/rate, that a writer who fell behind (blocked while the guard
// collapses the log, or descheduled) catches up on by at most catchUp
// bytes. In any span d it writes at most rate·d + catchUp + len(chunk). It
// returns what it wrote.
func pacedAppend(ctx context.Context, f *os.File, chunk []byte, total int64, rate float64, catchUp int) (int64, error) {
	every := time.Duration(float64(len(chunk)) / rate * float64(time.Second))
	behindAtMost := time.Duration(float64(catchUp) / rate * float64(time.Second))
	var written int64
	next := time.Now()
	for written < total {
		if err := ctx.Err(); err != nil {
			return written, err
		}
		// Rate limiting, not waiting for a condition.
		time.Sleep(time.Until(next))
		n, err := f.Write(chunk)
		written += int64(n)
		if err != nil {
			return written, err
		}
		next = next.Add(every)
		if earliest := time.Now().Add(-behindAtMost); next.Before(earliest) {
			next = earliest
		}
	}
	return written, nil
}

// logWatcher stats a log as often as it can, keeps its peaks, counts its
// cuts, and calls overrun at the first look past a bound.
type logWatcher struct {
	path                 string
	sizeBound, diskBound int64
	overrun              func()

	mu               sync.Mutex
	maxSize, maxDisk int64
	cuts             int
	over             string
}

func (w *logWatcher) run(ctx context.Context) {
	start := time.Now()
	var prev int64
	for ctx.Err() == nil {
		var st syscall.Stat_t
		if err := syscall.Stat(w.path, &st); err != nil {
			w.fail(fmt.Sprintf("stat %s: %v", w.path, err))
			return
		}
		disk := st.Blocks * 512
		w.mu.Lock()
		w.maxSize, w.maxDisk = max(w.maxSize, st.Size), max(w.maxDisk, disk)
		if st.Size < prev {
			w.cuts++
		}
		w.mu.Unlock()
		prev = st.Size
		if st.Size > w.sizeBound || disk > w.diskBound {
			w.fail(fmt.Sprintf("%s in, the console log is %d bytes taking %d bytes of disk, past its bounds %d and %d (cap %d)",
				time.Since(start).Round(time.Millisecond), st.Size, disk, w.sizeBound, w.diskBound, defaultConsoleLogCap))
			return
		}
		time.Sleep(time.Millisecond) // a poll interval: yield the core to the writers
	}
}

func (w *logWatcher) fail(msg string) {
	w.mu.Lock()
	if w.over == "" {
		w.over = msg
	}
	w.mu.Unlock()
	w.overrun()
}

// overrun1 is the first overrun seen, or "".
func (w *logWatcher) overrun1() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.over
}

// diskUse is the disk a file takes (st_blocks), in bytes.
func diskUse(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

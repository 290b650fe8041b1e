package imagepull

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/zyvor/kairon/internal/imagefs"
)

// Image is a pulled image, ready to boot.
type Image struct {
	// Reference is what was pulled; Digest what it resolved to.
	Reference string
	Digest    string
	// Path is the image's filesystem file on the node (imagefs layout).
	Path   string
	Config imagefs.Config
}

// Store pulls, verifies, converts and caches one image; it returns once
// the image's file is complete. Pulls of one reference or digest that
// overlap happen once inside it too.
type Store interface {
	Ensure(ctx context.Context, ref string, dockerConfigs [][]byte) (Image, error)
}

// Credentials reads the pull secrets' docker configs when a pull starts;
// nil when the Machine names none.
type Credentials func(ctx context.Context) ([][]byte, error)

// State is where an image is for a Machine that needs it.
type State int

const (
	// Pulling: a pull runs; the Machine waits (Status.Err holds the last
	// attempt's failure if it is a retry).
	Pulling State = iota
	// Ready: Status.Image is on the node.
	Ready
	// Failed: the image cannot be used (not found, unauthorized, too
	// large, wrong platform, invalid); Status.Err says which.
	Failed
)

// Status answers Get.
type Status struct {
	State State
	Image Image
	// Err is why the pull failed: for good (Failed) or for now (Pulling,
	// retried after a backoff).
	Err error
	// Started is true for the call that started this pull: the caller
	// records that it began (a Pulling event) once.
	Started bool
	// Took is how long the pull that made Image ready ran.
	Took time.Duration
}

// Timings of pulls. A failure for good is remembered a while so that
// every Machine of a bad image does not ask the registry again at once,
// and forgotten after, so that an image pushed since is found.
const (
	pullTimeout     = 30 * time.Minute
	firstRetry      = time.Second
	maxRetry        = 30 * time.Second
	rememberFailure = 30 * time.Second
)

// Puller runs background pulls, one per reference at a time.
type Puller struct {
	store Store
	// wake is told the Machines that waited for a pull once it ended.
	wake func(types.NamespacedName)
	now  func() time.Time

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	pulls map[string]*pull
}

type pull struct {
	// handedOut is when Get last answered Ready with the image.
	handedOut time.Time
	running   bool
	img       Image
	err       error
	ended     time.Time
	took      time.Duration
	failures  int
	waiters   map[types.NamespacedName]struct{}
}

// NewPuller pulls through store and calls wake for each Machine that
// asked about a pull once it ends.
func NewPuller(store Store, wake func(types.NamespacedName)) *Puller {
	ctx, cancel := context.WithCancel(context.Background())
	return &Puller{store: store, wake: wake, now: time.Now, ctx: ctx, cancel: cancel, pulls: map[string]*pull{}}
}

// Stop cancels the pulls that run and waits for them.
func (p *Puller) Stop() {
	p.cancel()
	p.wg.Wait()
}

// Pull is what a Machine asks for: an image reference and the
// credentials it may be pulled with.
type Pull struct {
	Reference string
	// Credentials reads the docker configs of the Machine's pull secrets;
	// nil pulls anonymously.
	Credentials Credentials
	// CredentialsKey names those credentials (the namespace and the
	// secrets' names): pulls of one reference with other credentials are
	// separate, so that one Machine's lack of access is not another's.
	CredentialsKey string
}

// Get says, without waiting, whether the image of pull is on the node for
// the Machine waiter, starting a pull when none runs and none ended
// recently.
func (p *Puller) Get(want Pull, waiter types.NamespacedName) Status {
	ref, creds := want.Reference, want.Credentials
	key := ref
	if want.CredentialsKey != "" {
		key += " " + want.CredentialsKey
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.pulls[key]
	now := p.now()
	if pl != nil && !pl.running {
		switch {
		case pl.err == nil:
			if _, err := os.Stat(pl.img.Path); err == nil {
				pl.handedOut = now
				return Status{State: Ready, Image: pl.img, Took: pl.took}
			}
			// Collected since: pull again.
		case !isTransient(pl.err) && now.Sub(pl.ended) < rememberFailure:
			return Status{State: Failed, Err: pl.err}
		case isTransient(pl.err) && now.Sub(pl.ended) < retryAfter(pl.failures):
			pl.waiters[waiter] = struct{}{}
			return Status{State: Pulling, Err: pl.err}
		}
	}
	if pl == nil {
		pl = &pull{waiters: map[types.NamespacedName]struct{}{}}
		p.pulls[key] = pl
	}
	pl.waiters[waiter] = struct{}{}
	if pl.running {
		return Status{State: Pulling}
	}
	lastErr := pl.err
	pl.running, pl.err = true, nil
	p.wg.Add(1)
	go p.run(ref, pl, creds)
	return Status{State: Pulling, Started: true, Err: lastErr}
}

func (p *Puller) run(ref string, pl *pull, creds Credentials) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, pullTimeout)
	defer cancel()
	start := p.now()
	img, err := p.pullOnce(ctx, ref, creds)
	p.mu.Lock()
	pl.running, pl.img, pl.err, pl.ended, pl.took = false, img, err, p.now(), p.now().Sub(start)
	if err != nil && isTransient(err) {
		pl.failures++
	} else {
		pl.failures = 0
	}
	waiters := pl.waiters
	pl.waiters = map[types.NamespacedName]struct{}{}
	p.mu.Unlock()
	for w := range waiters {
		p.wake(w)
	}
}

func (p *Puller) pullOnce(ctx context.Context, ref string, creds Credentials) (Image, error) {
	var configs [][]byte
	if creds != nil {
		var err error
		if configs, err = creds(ctx); err != nil {
			return Image{}, err
		}
	}
	img, err := p.store.Ensure(ctx, ref, configs)
	if err != nil {
		return Image{}, err
	}
	if img.Path == "" {
		return Image{}, fmt.Errorf("%s: the image store returned no file", ref)
	}
	return img, nil
}

// Recent are the digests of the images pulled, or handed to a Machine by
// Get, within the last d: a Machine about to start with one may not show
// it in its status yet, so the cache's collector keeps them too.
func (p *Puller) Recent(d time.Duration) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	var digests []string
	for _, pl := range p.pulls {
		if !pl.running && pl.err == nil && pl.img.Digest != "" && (now.Sub(pl.ended) < d || now.Sub(pl.handedOut) < d) {
			digests = append(digests, pl.img.Digest)
		}
	}
	return digests
}

// retryAfter is the backoff after n transient failures in a row.
func retryAfter(n int) time.Duration {
	d := firstRetry
	for i := 1; i < n && d < maxRetry; i++ {
		d *= 2
	}
	return min(d, maxRetry)
}

// TransientError marks a failure that may pass (a registry that does not
// answer, a secret not readable yet): the pull is retried.
type TransientError struct{ Err error }

func (e TransientError) Error() string   { return e.Err.Error() }
func (e TransientError) Unwrap() error   { return e.Err }
func (e TransientError) Transient() bool { return true }

func isTransient(err error) bool {
	var t interface{ Transient() bool }
	return errors.As(err, &t) && t.Transient()
}

package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Options configure a Server.
type Options struct {
	// SyncTimeout bounds how long Start waits for the first list of every
	// kind; zero means one minute.
	SyncTimeout time.Duration
	// Auth is how requests are authenticated; "" is AuthKubeconfig.
	Auth AuthMode
	// AllowWrite turns the actions on (evacuate a node, migrate a Machine,
	// scale a pool). Without it their endpoints answer 403 and no page
	// shows them.
	AllowWrite bool
	// EvacuatePoll is how often an evacuation until empty makes a pass
	// when nothing it watches changed; zero means 5 s.
	EvacuatePoll time.Duration
	// EvacuateStuckAfter is how long an evacuation until empty waits,
	// with nothing in flight and nothing it may move, before it stops as
	// Stuck; zero means 30 s.
	EvacuateStuckAfter time.Duration
	// EvacuateTimeout ends an evacuation until empty; zero means 1 h.
	EvacuateTimeout time.Duration
}

// Server serves the dashboard and the JSON API from an informer cache.
type Server struct {
	cfg     *rest.Config
	scheme  *runtime.Scheme
	mapper  meta.RESTMapper
	cache   cache.Cache
	hub     *hub
	mux     *http.ServeMux
	opts    Options
	reviews *reviews
	// evacuations are the evacuations until empty this process runs;
	// ctx is Start's, which ends them.
	evacuations *evacuations
	ctx         context.Context
	// authed serves what needs a user: the API and the pages.
	authed *http.ServeMux
	// self is the kubeconfig identity requests act as with AuthKubeconfig.
	self *user
}

// watched are the kinds the UI shows, by the name change notifications
// carry (the JSON API's resource names).
func watched() map[string]client.Object {
	return map[string]client.Object{
		"machines":           &kaironv1.Machine{},
		"machine-pools":      &kaironv1.MachinePool{},
		"machine-claims":     &kaironv1.MachineClaim{},
		"migrations":         &kaironv1.MachineMigration{},
		"network-policies":   &kaironv1.MachineNetworkPolicy{},
		"disruption-budgets": &kaironv1.MachineDisruptionBudget{},
		"nodes":              &corev1.Node{},
		"kubernetes-events":  &eventsv1.Event{},
	}
}

// Scheme is the scheme the UI's cache decodes with.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, kaironv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// New makes a Server reading the cluster cfg points at. Nothing is read
// until Start.
func New(cfg *rest.Config, opts Options) (*Server, error) {
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	c, err := cache.New(cfg, cache.Options{Scheme: scheme, Mapper: mapper, HTTPClient: httpClient})
	if err != nil {
		return nil, fmt.Errorf("creating the informer cache: %w", err)
	}
	if opts.SyncTimeout == 0 {
		opts.SyncTimeout = time.Minute
	}
	if opts.EvacuatePoll == 0 {
		opts.EvacuatePoll = 5 * time.Second
	}
	if opts.EvacuateStuckAfter == 0 {
		opts.EvacuateStuckAfter = 30 * time.Second
	}
	if opts.EvacuateTimeout == 0 {
		opts.EvacuateTimeout = time.Hour
	}
	switch opts.Auth {
	case "":
		opts.Auth = AuthKubeconfig
	case AuthKubeconfig, AuthToken:
	default:
		return nil, fmt.Errorf("unknown auth mode %q: use %s or %s", opts.Auth, AuthKubeconfig, AuthToken)
	}
	s := &Server{
		cfg: cfg, scheme: scheme, mapper: mapper, cache: c, hub: newHub(), mux: http.NewServeMux(), opts: opts,
		reviews: &reviews{m: map[string]reviewAnswer{}}, evacuations: &evacuations{}, ctx: context.Background(),
		self: &user{cfg: rest.CopyConfig(cfg), key: "", trusted: true},
	}
	s.routes()
	return s, nil
}

// Start starts an informer for every kind the UI shows and returns once
// each has listed, or with the error. The informers run until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	s.ctx = ctx
	for kind, obj := range watched() {
		inf, err := s.cache.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("watching %s: %w", kind, err)
		}
		notify := func(any) { s.hub.publish(kind) }
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    notify,
			UpdateFunc: func(_, o any) { notify(o) },
			DeleteFunc: notify,
		}); err != nil {
			return fmt.Errorf("watching %s: %w", kind, err)
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- s.cache.Start(ctx) }()
	syncCtx, cancel := context.WithTimeout(ctx, s.opts.SyncTimeout)
	defer cancel()
	if !s.cache.WaitForCacheSync(syncCtx) {
		select {
		case err := <-errc:
			return fmt.Errorf("informer cache stopped: %w", err)
		default:
		}
		return errors.New("the informer cache did not list every kind within " + s.opts.SyncTimeout.String() + ": can this identity list and watch Kairon's kinds, nodes and events.k8s.io events?")
	}
	if s.opts.Auth == AuthKubeconfig {
		// Shown on the pages, so it is clear whose rights they use.
		if name, err := s.whoami(ctx, s.self); err == nil {
			s.self.name = name
		}
	}
	return nil
}

// Handler is the whole UI: pages, assets, the JSON API and the event stream.
func (s *Server) Handler() http.Handler { return gzipped(s.mux) }

func (s *Server) routes() {
	// Open to all: the assets and the login page.
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(staticFS())))
	s.mux.HandleFunc("GET /login", s.login)
	s.mux.HandleFunc("POST /login", s.login)
	s.mux.HandleFunc("POST /logout", s.logout)
	// kairon-ui listens only once its cache is filled, so answering is
	// being ready.
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})

	// Everything else acts as the request's user.
	s.authed = http.NewServeMux()
	s.mux.Handle("/", s.authenticate(s.authed))
	s.authed.HandleFunc("GET /api/v1/disruption-budgets", s.apiBudgets)
	s.authed.HandleFunc("GET /api/v1/nodes", s.apiNodes)
	s.authed.HandleFunc("GET /api/v1/machines", s.apiMachines)
	s.authed.HandleFunc("GET /api/v1/machine-pools", s.apiPools)
	s.authed.HandleFunc("GET /api/v1/machine-claims", s.apiClaims)
	s.authed.HandleFunc("GET /api/v1/migrations", s.apiMigrations)
	s.authed.HandleFunc("GET /api/v1/network-policies", s.apiPolicies)
	s.authed.HandleFunc("GET /api/v1/events", s.apiEvents)
	s.authed.HandleFunc("GET /api/v1/evacuations", s.apiEvacuations)
	s.authed.HandleFunc("GET /api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.URL.Path)
	})
	s.actionRoutes()
	s.pageRoutes()
}

// hub fans change notifications out to the event streams.
type hub struct {
	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

// subscriber is one event stream: the kinds changed since it last looked,
// and a wake-up signal.
type subscriber struct {
	wake    chan struct{}
	mu      sync.Mutex
	pending map[string]bool
}

func newHub() *hub { return &hub{subs: map[*subscriber]struct{}{}} }

func (h *hub) subscribe() *subscriber {
	s := &subscriber{wake: make(chan struct{}, 1), pending: map[string]bool{}}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s
}

func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	delete(h.subs, s)
	h.mu.Unlock()
}

// publish records that kind changed for every subscriber; changes coalesce,
// so a slow stream never blocks an informer.
func (h *hub) publish(kind string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.mu.Lock()
		s.pending[kind] = true
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// take returns and clears the kinds changed.
func (s *subscriber) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	kinds := make([]string, 0, len(s.pending))
	for k := range s.pending {
		kinds = append(kinds, k)
	}
	clear(s.pending)
	return kinds
}

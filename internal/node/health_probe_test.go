package node_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/localport"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
)

// The DaemonSet's probes reach the agent: /healthz answers while it runs,
// /readyz once its cache is synced and it wrote its Node.
func TestAgentHealthProbes(t *testing.T) {
	env := testenv.Get(t)
	addr, err := localport.FreeAddress()
	if err != nil {
		t.Fatal(err)
	}
	nodeName := "health-" + env.Namespace(t)
	stop := runSimAgent(t, env, nodeName, t.TempDir(), nil, func(o *node.Options) {
		o.HealthProbeAddress = addr
		o.HeartbeatInterval = time.Second
	})
	defer stop()

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path + "?verbose")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testenv.Eventually(t, 30*time.Second, "the agent to report ready", func() (bool, string) {
		code, body := get("/readyz")
		return code == http.StatusOK, fmt.Sprintf("%d %s", code, body)
	})
	if code, body := get("/readyz/node-heartbeat"); code != http.StatusOK {
		t.Errorf("/readyz/node-heartbeat: %d %s", code, body)
	}
	if code, body := get("/readyz/machines-cache-synced"); code != http.StatusOK {
		t.Errorf("/readyz/machines-cache-synced: %d %s", code, body)
	}
	if code, body := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %s", code, body)
	}
}

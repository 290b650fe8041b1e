package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/testenv"
)

// kairon-controller -pprof-bind-address serves Go's profiles there, so a
// slow controller can be profiled where it runs (go tool pprof
// http://ADDRESS/debug/pprof/profile).
func TestControllerServesProfilesWhenAsked(t *testing.T) {
	env := testenv.Get(t)
	addr := freeLoopbackAddress(t)
	startControllerWith(t, env, "-pprof-bind-address", addr)
	c := &http.Client{Timeout: 10 * time.Second}
	testenv.Eventually(t, 2*time.Minute, "kairon-controller's /debug/pprof/cmdline", func() (bool, string) {
		resp, err := c.Get("http://" + addr + "/debug/pprof/cmdline")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), "kairon-controller"),
			fmt.Sprintf("%s: %q", resp.Status, body)
	})
}

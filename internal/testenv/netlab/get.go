package netlab

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"
)

// Get fetches url from inside namespace ns and returns the body, whatever
// the status. The connection is dialled on a thread in ns (In), so the
// request leaves from ns's routes and addresses while the rest of the
// test stays where it is.
func Get(ns, url string) (string, error) {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := In(ns, func() error {
			var err error
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
	c := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true},
	}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

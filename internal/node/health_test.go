package node

import (
	"strings"
	"testing"
	"time"
)

func TestHeartbeatFresh(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	interval := 10 * time.Second
	tests := []struct {
		name    string
		last    int64
		wantErr string
	}{
		{"never written", 0, "not written its Node yet"},
		{"just now", now.UnixNano(), ""},
		{"three intervals ago", now.Add(-30 * time.Second).UnixNano(), ""},
		{"past three intervals", now.Add(-31 * time.Second).UnixNano(), "last wrote its Node 31s ago (heartbeat every 10s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := heartbeatFresh(tt.last, now, interval)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("got %v, want ready", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("got %v, want an error with %q", err, tt.wantErr)
			}
		})
	}
}

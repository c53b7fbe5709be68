package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStopKillsAProcessThatIgnoresSIGTERMAfterTheGrace(t *testing.T) {
	t.Parallel()
	p, err := StartProc("stubborn", filepath.Join(t.TempDir(), "log"),
		exec.Command("sh", "-c", "trap '' TERM; echo ready; sleep 60"))
	require.NoError(t, err)
	t.Cleanup(p.Kill)
	require.Eventually(t, func() bool { return strings.Contains(LogTail(p.Log, 100), "ready") },
		5*time.Second, 10*time.Millisecond, "the trap is set")

	start := time.Now()
	p.Stop(200 * time.Millisecond)
	assert.True(t, p.Exited())
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "SIGTERM alone did not end it")
	assert.Error(t, p.Err(), "killed")
	p.Stop(time.Second) // a second Stop is harmless
	assert.Error(t, p.Signal(os.Interrupt), "no signal to an exited process")
}

func TestWaitListenReportsTheLogOfAProcessThatDied(t *testing.T) {
	t.Parallel()
	p, err := StartProc("dies", filepath.Join(t.TempDir(), "log"), exec.Command("sh", "-c", "echo boom; exit 3"))
	require.NoError(t, err)
	err = p.WaitListen(t.Context(), "127.0.0.1:1", 5*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "boom")
	assert.Contains(t, err.Error(), "exit status 3")
}

func TestLogTailStartsAtALine(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "log")
	require.NoError(t, os.WriteFile(path, []byte("first line\nsecond\nthird\n"), 0o644))
	assert.Equal(t, "third\n", LogTail(path, 10))
	assert.Equal(t, "first line\nsecond\nthird\n", LogTail(path, 100))
	assert.Equal(t, "second third", OneLine(LogTail(path, 15)))
}

func TestFreePortsAreDistinct(t *testing.T) {
	t.Parallel()
	ports, err := FreePorts(5)
	require.NoError(t, err)
	seen := map[int]bool{}
	for _, p := range ports {
		assert.False(t, seen[p], "port %d twice", p)
		seen[p] = true
	}
}

func TestModuleRootIsThePluginsCheckoutFromANestedModule(t *testing.T) {
	root := ModuleRoot(t)
	assert.FileExists(t, filepath.Join(root, "cmd", "caddy", "main.go"))
	t.Chdir(filepath.Join(root, "bench", "internal"))
	assert.Equal(t, root, ModuleRoot(t), "bench/go.mod declares a module path of its own")
}

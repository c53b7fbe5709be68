package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// ModulePath is the plugin's module path: ModuleRoot looks for the
// go.mod that declares it.
const ModulePath = "github.com/fair-queue/caddy-fair-queue"

// buildTimeout bounds the one go build of the Caddy binary; a cold build
// takes minutes on a small machine.
const buildTimeout = 15 * time.Minute

// workDir holds the Caddy binary; Main makes it and removes it.
var workDir string

var build struct {
	once sync.Once
	bin  string
	err  error
}

// Main runs the tests of m with a work directory for the Caddy binary,
// and removes it afterwards; call it from TestMain.
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "fair-queue-caddy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "harness:", err)
		return 1
	}
	workDir = dir
	defer os.RemoveAll(dir)
	return m.Run()
}

// ModuleRoot returns the plugin's checkout: the nearest directory above
// the working directory (a test's package directory) whose go.mod
// declares ModulePath. The modules inside it (bench, e2e) declare paths
// of their own, so a test there finds the plugin's root too.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if modulePath(filepath.Join(dir, "go.mod")) == ModulePath {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("harness: no go.mod of %s above the working directory", ModulePath)
		}
		dir = parent
	}
}

// modulePath returns the path the go.mod at path declares, or "".
func modulePath(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// CaddyBinary builds ./cmd/caddy of the plugin's checkout the first time
// a test needs it, with the go command running the tests (go test puts
// its GOROOT/bin first in PATH), and fails every test that needs it if
// the build failed.
func CaddyBinary(t testing.TB) string {
	t.Helper()
	root := ModuleRoot(t)
	build.once.Do(func() {
		if workDir == "" {
			build.err = errors.New("harness: call harness.Main from TestMain")
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			build.err = fmt.Errorf("find the go command: %w", err)
			return
		}
		bin := filepath.Join(workDir, "caddy")
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", bin, "./cmd/caddy")
		cmd.Dir = root
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build ./cmd/caddy: %w\n%s", err, out)
			return
		}
		fmt.Fprintf(os.Stderr, "harness: built %s in %v\n", bin, time.Since(start).Round(time.Millisecond))
		build.bin = bin
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

package caddyfairqueue

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
)

// optionParser reads the arguments of one option of a block.
type optionParser = func(*caddyfile.Dispenser) error

// parseBlock parses the block that follows the current token, calling
// the parser of each option; an unknown option, or one given twice that
// is not repeatable, is an error.
func parseBlock(d *caddyfile.Dispenser, opts map[string]optionParser, repeatable ...string) error {
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		parse, ok := opts[opt]
		if !ok {
			// Spelt as another block's option: that block is the
			// likelier meaning than a near name of this one.
			hint := blockHint(opt)
			if hint == "" {
				hint = suggest(opt, slices.Collect(maps.Keys(opts)), "'")
			}
			return d.Errf("unrecognized subdirective '%s'%s", opt, hint)
		}
		if seen[opt] && !slices.Contains(repeatable, opt) {
			return d.Errf("subdirective '%s' is given twice", opt)
		}
		seen[opt] = true
		if err := parse(d); err != nil {
			return err
		}
	}
	return nil
}

// opt is the parser of an option whose arguments read reads into dst.
func opt[T any](dst *T, read func(*caddyfile.Dispenser) (T, error)) optionParser {
	return func(d *caddyfile.Dispenser) (err error) {
		*dst, err = read(d)
		return err
	}
}

// checkedOpt reads the option's one argument into dst and applies rule,
// the option's predicate, so that an error names the option's line.
func checkedOpt(dst *string, rule func(string) error) optionParser {
	return func(d *caddyfile.Dispenser) (err error) {
		if *dst, err = stringArg(d); err != nil {
			return err
		}
		if err := rule(*dst); err != nil {
			return d.Err(err.Error())
		}
		return nil
	}
}

// flagOpt sets dst for an option that takes no argument.
func flagOpt(dst *bool) optionParser {
	return func(d *caddyfile.Dispenser) error {
		if opt := d.Val(); d.NextArg() {
			return argCountErr(d, opt, "no value")
		}
		*dst = true
		return nil
	}
}

// pairOpt reads `<key> <value>` of a repeatable option into *m, the
// value converted by parse; a key may be given once (what names it).
// syntax is what the option takes, for the error of a line without
// both, such as "<name> <template>".
func pairOpt[V any](m *map[string]V, what, syntax string, parse func(d *caddyfile.Dispenser, key, value string) (V, error)) optionParser {
	return func(d *caddyfile.Dispenser) error {
		opt := d.Val()
		args := d.RemainingArgs()
		if len(args) != 2 {
			return argCountErr(d, opt, syntax)
		}
		if _, dup := (*m)[args[0]]; dup {
			return d.Errf("%s '%s' is given twice", what, args[0])
		}
		v, err := parse(d, args[0], args[1])
		if err != nil {
			return err
		}
		if *m == nil {
			*m = make(map[string]V)
		}
		(*m)[args[0]] = v
		return nil
	}
}

// stringArg reads exactly one argument of the option at d.
func stringArg(d *caddyfile.Dispenser) (string, error) {
	opt := d.Val()
	if !d.NextArg() {
		return "", argCountErr(d, opt, "one value")
	}
	v := d.Val()
	if d.NextArg() {
		return "", argCountErr(d, opt, "one value")
	}
	return v, nil
}

// argCountErr is Caddy's ArgErr naming the option and what it takes
// (want: "one value", "<name>...", a syntax): Caddy's own names only
// the token after which the line went wrong ("after '5'"), which does
// not say which option of the line is meant nor what to write.
func argCountErr(d *caddyfile.Dispenser, opt, want string) error {
	return d.Errf("%s: wrong argument count, want %s", opt, want)
}

// optionArg reads the one argument of the option at d, and its name.
func optionArg(d *caddyfile.Dispenser) (opt, v string, err error) {
	opt = d.Val()
	v, err = stringArg(d)
	return opt, v, err
}

// intArg reads one integer argument of at least minimum.
func intArg(minimum int) func(*caddyfile.Dispenser) (int, error) {
	return intRangeArg(minimum, math.MaxInt)
}

// intRangeArg reads one integer argument of at least minimum and at most
// maximum.
func intRangeArg(minimum, maximum int) func(*caddyfile.Dispenser) (int, error) {
	return func(d *caddyfile.Dispenser) (int, error) {
		opt, v, err := optionArg(d)
		if err != nil {
			return 0, err
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0, d.Errf("%s: '%s' is not an integer", opt, v)
		}
		if n < minimum {
			return 0, d.Errf("%s must be at least %d, got %d", opt, minimum, n)
		}
		if n > maximum {
			return 0, d.Errf("%s must be at most %d, got %d", opt, maximum, n)
		}
		return n, nil
	}
}

// within reads an argument with read and checks it with rule, the
// option's own bound, so that a value out of it is refused at the
// option's line rather than at the line that closes the block, where
// the rules that join options are checked.
func within[T any](read func(*caddyfile.Dispenser) (T, error), rule func(T) error) func(*caddyfile.Dispenser) (T, error) {
	return func(d *caddyfile.Dispenser) (T, error) {
		v, err := read(d)
		if err != nil {
			return v, err
		}
		if err := rule(v); err != nil {
			return v, d.Err(err.Error())
		}
		return v, nil
	}
}

// durationArg reads one duration argument of at least minimum.
func durationArg(minimum time.Duration) func(*caddyfile.Dispenser) (caddy.Duration, error) {
	return func(d *caddyfile.Dispenser) (caddy.Duration, error) {
		opt, v, err := optionArg(d)
		if err != nil {
			return 0, err
		}
		dur, err := caddy.ParseDuration(v)
		if err != nil {
			return 0, d.Errf("%s: invalid duration '%s'", opt, v)
		}
		if dur < minimum {
			return 0, d.Errf("%s must be at least %s, got %s", opt, minimum, v)
		}
		return caddy.Duration(dur), nil
	}
}

// offDurationArg reads one duration argument of at least 1ms, or "off"
// (a negative duration: the option's behaviour is off).
func offDurationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	opt, v, err := optionArg(d)
	if err != nil {
		return 0, err
	}
	if v == "off" {
		return -1, nil
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil || dur < minDuration {
		return 0, d.Errf("%s: want a duration of at least %s or off, got '%s'", opt, minDuration, v)
	}
	return caddy.Duration(dur), nil
}

// sizeArg reads one positive size argument such as 8MiB or 512KB.
func sizeArg(d *caddyfile.Dispenser) (int64, error) {
	opt, v, err := optionArg(d)
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(v)
	if err != nil || n > math.MaxInt64 {
		return 0, d.Errf("%s: invalid size '%s'", opt, v)
	}
	if n == 0 {
		return 0, d.Errf("%s must be positive, got %s", opt, v)
	}
	return int64(n), nil
}

// floatArg reads one number argument within [lo, hi].
func floatArg(lo, hi float64) func(*caddyfile.Dispenser) (float64, error) {
	return func(d *caddyfile.Dispenser) (float64, error) {
		opt, v, err := optionArg(d)
		if err != nil {
			return 0, err
		}
		return parseFloatArg(d, opt, v, lo, hi)
	}
}

// parseFloatArg parses v, the value of option opt, as a number within
// [lo, hi].
func parseFloatArg(d *caddyfile.Dispenser, opt, v string, lo, hi float64) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, d.Errf("%s: '%s' is not a number", opt, v)
	}
	if f < lo || f > hi {
		if math.IsInf(hi, 1) {
			return 0, d.Errf("%s must be at least %v, got %s", opt, lo, v)
		}
		return 0, d.Errf("%s must be %v to %v, got %s", opt, lo, hi, v)
	}
	return f, nil
}

using System.Globalization;
using Microsoft.Extensions.Configuration;

namespace Tern.Proxy.Configuration;

/// <summary>
/// Reads typed settings from raw configuration, recording a problem (with the full key) for
/// every value that does not parse, so that start-up can report all of them at once.
/// It also remembers which keys it read, so keys nobody reads can be reported as typos.
/// </summary>
internal sealed class SettingReader(IConfiguration configuration)
{
    private readonly HashSet<string> _read = new(StringComparer.OrdinalIgnoreCase);

    public List<ConfigurationProblem> Problems { get; } = [];

    public void Add(string key, string message) => Problems.Add(new ConfigurationProblem(key, message));

    public string? String(string key)
    {
        _read.Add(key);
        var value = configuration[key];
        return string.IsNullOrWhiteSpace(value) ? null : value.Trim();
    }

    public int Port(string key, int fallback)
    {
        var text = String(key);
        if (text is null)
        {
            return fallback;
        }

        if (!int.TryParse(text, NumberStyles.None, CultureInfo.InvariantCulture, out var port) || port is < 1 or > 65535)
        {
            Add(key, $"'{text}' is not a port number (1-65535)");
            return fallback;
        }

        return port;
    }

    /// <summary>One of values (any case), returned as spelt there; what names the kind of value in the problem.</summary>
    public string OneOf(string key, IReadOnlyList<string> values, string fallback, string what)
    {
        var text = String(key);
        if (text is null)
        {
            return fallback;
        }

        foreach (var value in values)
        {
            if (string.Equals(text, value, StringComparison.OrdinalIgnoreCase))
            {
                return value;
            }
        }

        Add(key, $"'{text}' is not {what}; use {string.Join(", ", values.Take(values.Count - 1))} or {values[^1]}");
        return fallback;
    }

    public bool Bool(string key, bool fallback)
    {
        var text = String(key);
        if (text is null)
        {
            return fallback;
        }

        if (!bool.TryParse(text, out var value))
        {
            Add(key, $"'{text}' is not true or false");
            return fallback;
        }

        return value;
    }

    /// <summary>Longest duration any setting accepts; beyond it timers overflow and nothing sensible waits that long.</summary>
    public static readonly TimeSpan MaxDuration = TimeSpan.FromDays(1);

    /// <summary>
    /// Shortest duration any setting accepts. Shorter values round to nothing or next to it (1e-8
    /// seconds is zero ticks): a handshake timeout of 100 ns fails every handshake, and .NET's
    /// timers refuse zero.
    /// </summary>
    public static readonly TimeSpan MinDuration = TimeSpan.FromMilliseconds(1);

    /// <summary>A duration from 1 ms up to one day, written as hh:mm:ss (or d.hh:mm:ss, or a number of seconds).</summary>
    public TimeSpan Duration(string key, TimeSpan fallback)
    {
        var text = String(key);
        if (text is null)
        {
            return fallback;
        }

        var (value, problem) = ParseDuration(text);
        if (problem is not null)
        {
            Add(key, problem);
            return fallback;
        }

        return value;
    }

    /// <summary>The duration <see cref="Duration"/> reads from text, or the problem with it.</summary>
    public static (TimeSpan Value, string? Problem) ParseDuration(string text)
    {
        TimeSpan value;
        if (double.TryParse(text, NumberStyles.Float, CultureInfo.InvariantCulture, out var seconds) && seconds > 0)
        {
            value = seconds > MaxDuration.TotalSeconds ? TimeSpan.MaxValue : TimeSpan.FromSeconds(seconds);
        }
        else if (!TimeSpan.TryParse(text, CultureInfo.InvariantCulture, out value) || value <= TimeSpan.Zero)
        {
            return (default, $"'{text}' is not a positive duration (hh:mm:ss, e.g. 00:00:30)");
        }

        if (value < MinDuration)
        {
            return (default, $"'{text}' is shorter than the minimum of {MinDuration.TotalMilliseconds:0} ms");
        }

        if (value > MaxDuration)
        {
            return (default, $"'{text}' is longer than the maximum of {MaxDuration:c}");
        }

        return (value, null);
    }

    /// <summary>
    /// For a value .NET's configuration binder or YARP reads as a TimeSpan: a bare number is a
    /// number of days there ("30" is 30 days), never what an operator means. The problem, or null.
    /// </summary>
    public static string? BareNumberForTimeSpan(string? value)
    {
        if (!double.TryParse(value, NumberStyles.Float, CultureInfo.InvariantCulture, out var number))
        {
            return null;
        }

        // Both readings, where they are durations at all (not NaN, negative or beyond TimeSpan).
        var examples = double.IsFinite(number) && number > 0 && number < 1e9
            ? $" ({TimeSpan.FromSeconds(number):c} for {value} seconds, {TimeSpan.FromDays(number):c} for {value} days)"
            : "";
        return $"'{value}' is not a duration: write [d.]hh:mm:ss{examples}; .NET reads a bare number as days";
    }

    /// <summary>The values of an array setting (key:0, key:1, ...), in order.</summary>
    public IReadOnlyList<string> List(string key)
    {
        _read.Add(key);
        var items = new List<string>();
        foreach (var child in configuration.GetSection(key).GetChildren())
        {
            _read.Add(child.Path);
            if (!string.IsNullOrWhiteSpace(child.Value))
            {
                items.Add(child.Value.Trim());
            }
        }

        // A single value given where a list is expected (Tern__X=a) is taken as a one-item list.
        var single = configuration[key];
        if (items.Count == 0 && !string.IsNullOrWhiteSpace(single))
        {
            items.Add(single.Trim());
        }
        else if (items.Count > 0 && !string.IsNullOrWhiteSpace(single))
        {
            // One source sets a value, another a list (Tern__X=a over a JSON array): neither wins
            // in .NET's configuration, and taking either would drop the other without a word.
            Add(key, $"'{single.Trim()}' is given as one value and {key} as a list elsewhere; give every item as {key}:0, {key}:1 (environment: {UnreadSetting.Environment(key)}__0)");
        }

        return items;
    }

    /// <summary>Names of the child sections of key (e.g. the certificate names).</summary>
    public IEnumerable<string> Names(string key) =>
        configuration.GetSection(key).GetChildren().Select(c => c.Key);

    /// <summary>Leaf keys under section that no read asked for: most likely misspelt settings.</summary>
    public IEnumerable<string> UnreadKeys(string section) =>
        configuration.GetSection(section).AsEnumerable()
            .Where(pair => pair.Value is not null && !_read.Contains(pair.Key))
            .Select(pair => pair.Key)
            .Order(StringComparer.OrdinalIgnoreCase);
}

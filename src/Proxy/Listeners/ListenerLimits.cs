using System.Globalization;
using System.Reflection;
using Microsoft.AspNetCore.Server.Kestrel.Core;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Listeners;

/// <summary>
/// Kestrel's limits, under ASP.NET Core's own names (Kestrel:Limits:MaxRequestBodySize,
/// Kestrel:Limits:Http2:MaxStreamsPerConnection, ...), for every listener. The rest of the Kestrel
/// section (endpoints, certificates) is not read: Tern sets its listeners itself.
/// </summary>
/// <remarks>
/// Names and types come from Kestrel's own limits classes, and every value is checked by setting it
/// on them, so Kestrel's ranges are the rule. An empty value (or JSON null) is Kestrel's null: no
/// limit, where the limit allows none.
/// </remarks>
internal static class ListenerLimits
{
    public const string Section = "Kestrel:Limits";

    /// <summary>
    /// The values under Kestrel:Limits, each limit checked alone (a data rate's two parts together),
    /// then the limits Kestrel checks against each other. Each problem names its key; the values
    /// returned are those that passed.
    /// </summary>
    public static IReadOnlyList<KeyValuePair<string, string?>> Read(IConfiguration configuration, List<ConfigurationProblem> problems)
    {
        var leaves = configuration.GetSection(Section).AsEnumerable()
            .Where(pair => pair.Key.Length > Section.Length && (pair.Value is not null || !configuration.GetSection(pair.Key).GetChildren().Any()))
            .ToList();
        var accepted = new List<KeyValuePair<string, string?>>();
        var found = problems.Count;
        foreach (var limit in leaves.GroupBy(pair => DataRateOf(pair.Key) ?? pair.Key, StringComparer.OrdinalIgnoreCase))
        {
            var values = limit.ToList();
            var problem = Problem(limit.Key, values);
            if (problem is null)
            {
                accepted.AddRange(values);
            }
            else
            {
                problems.Add(problem);
            }
        }

        if (problems.Count == found)
        {
            CheckTogether(accepted, problems);
        }

        return accepted;
    }

    /// <summary>Sets checked values (from <see cref="Read"/>) on Kestrel's limits.</summary>
    public static void Apply(IReadOnlyList<KeyValuePair<string, string?>> values, KestrelServerLimits limits)
    {
        var bound = new List<KeyValuePair<string, string?>>();
        foreach (var (key, value) in values)
        {
            if (string.IsNullOrEmpty(value))
            {
                SetNull(limits, key);
                continue;
            }

            // A data rate has no setters, only a constructor: the binder builds one only where
            // the limit is null, and would otherwise leave the old one in place.
            if (DataRateOf(key) is { } rate)
            {
                SetNull(limits, rate);
            }

            bound.Add(new(key, value));
        }

        if (bound.Count > 0)
        {
            new ConfigurationBuilder().AddInMemoryCollection(bound).Build().GetSection(Section)
                .Bind(limits, binder => binder.ErrorOnUnknownConfiguration = true);
        }
    }

    /// <summary>
    /// Every limit in force with these values, defaults included, as key and text: what a reload
    /// compares, so that removing a limit counts as a change and rewriting one the same does not.
    /// </summary>
    public static IEnumerable<(string Key, string Value)> Effective(IReadOnlyList<KeyValuePair<string, string?>> values)
    {
        var limits = new KestrelServerLimits();
        Apply(values, limits);
        foreach (var (key, value) in Flatten(Section, limits))
        {
            yield return (key, value);
        }
    }

    /// <summary>Keys under Kestrel that Tern does not read (all but the limits under Kestrel:Limits), to be logged as ignored.</summary>
    public static IEnumerable<string> IgnoredKeys(IConfiguration configuration) =>
        configuration.GetSection("Kestrel").AsEnumerable()
            .Where(pair => !string.IsNullOrEmpty(pair.Value)
                && !pair.Key.StartsWith(Section + ":", StringComparison.OrdinalIgnoreCase))
            .Select(pair => pair.Key);

    private static ConfigurationProblem? Problem(string limit, List<KeyValuePair<string, string?>> values)
    {
        foreach (var (key, value) in values)
        {
            var property = Resolve(key);
            if (property is null)
            {
                return key.StartsWith(Section + ":Http3", StringComparison.OrdinalIgnoreCase)
                    ? new(key, "Tern does not serve HTTP/3")
                    : new(key, "is not one of Kestrel's limits (misspelt?); README \"Listener limits\" lists them");
            }

            var type = Nullable.GetUnderlyingType(property.PropertyType) ?? property.PropertyType;
            if ((type == typeof(Http2Limits) || type == typeof(MinDataRate)) && (!string.IsNullOrEmpty(value) || !property.CanWrite))
            {
                return new(key, $"is a group of limits, not a value: set its parts ({key}:{(type == typeof(MinDataRate) ? "BytesPerSecond and :GracePeriod" : "MaxStreamsPerConnection, ...")})");
            }

            if (string.IsNullOrEmpty(value))
            {
                if (type.IsValueType && Nullable.GetUnderlyingType(property.PropertyType) is null)
                {
                    return new(key, "is empty, which means no limit, and Kestrel always applies this one: give a value");
                }
            }
            else if (type == typeof(TimeSpan) && SettingReader.BareNumberForTimeSpan(value) is { } bare)
            {
                return new(key, bare);
            }
            else if (type == typeof(double) && double.TryParse(value, NumberStyles.Float, CultureInfo.InvariantCulture, out var number) && !double.IsFinite(number))
            {
                return new(key, $"'{value}' is not a finite number");
            }
        }

        if (DataRateOf(values[0].Key) is not null
            && !(values.Any(v => v.Key.EndsWith(":BytesPerSecond", StringComparison.OrdinalIgnoreCase))
                && values.Any(v => v.Key.EndsWith(":GracePeriod", StringComparison.OrdinalIgnoreCase))))
        {
            return new(limit, "needs both BytesPerSecond and GracePeriod (e.g. 240 and 00:00:05), or an empty value for none");
        }

        try
        {
            Apply(values, new KestrelServerLimits());
            return null;
        }
        catch (InvalidOperationException ex) when (ex.InnerException is FormatException or ArgumentException or OverflowException or NotSupportedException)
        {
            // The binder could not convert the text ("Failed to convert configuration value ...").
            var (key, value) = values.Count == 1 ? values[0] : values.FirstOrDefault(v => ex.Message.Contains($"'{v.Key}'", StringComparison.OrdinalIgnoreCase));
            var declared = key is null ? null : Resolve(key)!.PropertyType;
            var type = declared is null ? null : Nullable.GetUnderlyingType(declared) ?? declared;
            var expected = type == typeof(TimeSpan) ? "a duration (hh:mm:ss, e.g. 00:02:10)"
                : type == typeof(bool) ? "true or false"
                : type == typeof(double) ? "a number"
                : type is not null && type.IsPrimitive ? "a whole number"
                : "a value of the limit's type";
            return new(key ?? limit, $"'{value}' is not {expected}");
        }
        catch (TargetInvocationException ex) when (ex.InnerException is ArgumentException argument)
        {
            // Kestrel's own range check, in the limit's setter or a data rate's constructor.
            var message = argument.Message.Split('\n')[0].Replace($" (Parameter '{argument.ParamName}')", "", StringComparison.Ordinal).Trim();
            return values.Count == 1
                ? new(values[0].Key, $"'{values[0].Value}' is out of range: {message}")
                : new(limit, $"is out of range: {message}");
        }
        catch (InvalidOperationException ex)
        {
            return new(limit, ex.Message.Split('\n')[0]);
        }
    }

    /// <summary>What Kestrel checks between limits when it starts (KestrelServerImpl.ValidateOptions).</summary>
    private static void CheckTogether(IReadOnlyList<KeyValuePair<string, string?>> values, List<ConfigurationProblem> problems)
    {
        var limits = new KestrelServerLimits();
        Apply(values, limits);
        const string buffer = Section + ":" + nameof(KestrelServerLimits.MaxRequestBufferSize);
        if (limits.MaxRequestBufferSize is { } size)
        {
            if (size < limits.MaxRequestLineSize)
            {
                problems.Add(new(buffer, $"{size} is smaller than {Section}:{nameof(KestrelServerLimits.MaxRequestLineSize)} ({limits.MaxRequestLineSize}); Kestrel needs the buffer to hold a whole request line"));
            }

            if (size < limits.MaxRequestHeadersTotalSize)
            {
                problems.Add(new(buffer, $"{size} is smaller than {Section}:{nameof(KestrelServerLimits.MaxRequestHeadersTotalSize)} ({limits.MaxRequestHeadersTotalSize}); Kestrel needs the buffer to hold a request's headers"));
            }
        }
    }

    /// <summary>The limit property a key names (Kestrel:Limits:Http2:MaxStreamsPerConnection), or null. HTTP/3's are not Tern's.</summary>
    private static PropertyInfo? Resolve(string key)
    {
        var segments = key[(Section.Length + 1)..].Split(':');
        var type = typeof(KestrelServerLimits);
        PropertyInfo? property = null;
        foreach (var segment in segments)
        {
            property = type.GetProperty(segment, BindingFlags.Public | BindingFlags.Instance | BindingFlags.IgnoreCase);
            if (property is null || property.PropertyType == typeof(Http3Limits))
            {
                return null;
            }

            type = Nullable.GetUnderlyingType(property.PropertyType) ?? property.PropertyType;
        }

        return property;
    }

    /// <summary>The data rate a key is part of (Kestrel:Limits:MinRequestBodyDataRate for its :GracePeriod), or null.</summary>
    private static string? DataRateOf(string key)
    {
        var parent = key[..Math.Max(key.LastIndexOf(':'), 0)];
        return parent.Length > Section.Length && Resolve(parent)?.PropertyType == typeof(MinDataRate) ? parent : null;
    }

    /// <summary>Sets the limit a key names to null (on Kestrel's limits or on its Http2 limits).</summary>
    private static void SetNull(KestrelServerLimits limits, string key)
    {
        object owner = limits;
        var segments = key[(Section.Length + 1)..].Split(':');
        foreach (var segment in segments[..^1])
        {
            owner = owner.GetType().GetProperty(segment, BindingFlags.Public | BindingFlags.Instance | BindingFlags.IgnoreCase)!.GetValue(owner)!;
        }

        owner.GetType().GetProperty(segments[^1], BindingFlags.Public | BindingFlags.Instance | BindingFlags.IgnoreCase)!.SetValue(owner, null);
    }

    private static IEnumerable<(string Key, string Value)> Flatten(string prefix, object limits)
    {
        foreach (var property in limits.GetType().GetProperties(BindingFlags.Public | BindingFlags.Instance).OrderBy(p => p.Name, StringComparer.Ordinal))
        {
            var value = property.GetValue(limits);
            if (value is Http2Limits http2)
            {
                foreach (var pair in Flatten($"{prefix}:{property.Name}", http2))
                {
                    yield return pair;
                }
            }
            else if (value is not Http3Limits)
            {
                yield return ($"{prefix}:{property.Name}", value switch
                {
                    null => "none",
                    MinDataRate rate => $"{rate.BytesPerSecond.ToString(CultureInfo.InvariantCulture)} bytes per second after {rate.GracePeriod:c}",
                    TimeSpan span => span.ToString("c", CultureInfo.InvariantCulture),
                    IFormattable formattable => formattable.ToString(null, CultureInfo.InvariantCulture),
                    _ => value.ToString() ?? "",
                });
            }
        }
    }
}

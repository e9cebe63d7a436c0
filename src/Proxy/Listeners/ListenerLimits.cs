using System.Reflection;
using Microsoft.AspNetCore.Server.Kestrel.Core;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Listeners;

/// <summary>
/// Kestrel's limits, under ASP.NET Core's own names (Kestrel:Limits:MaxRequestBodySize,
/// Kestrel:Limits:Http2:MaxStreamsPerConnection, ...), for every listener. The rest of the Kestrel
/// section (endpoints, certificates) is not read: Tern sets its listeners itself.
/// </summary>
internal static class ListenerLimits
{
    public const string Section = "Kestrel:Limits";

    /// <summary>
    /// The values under Kestrel:Limits, each limit checked by binding it to Kestrel's own limits
    /// object, so that Kestrel's names, types and ranges are the rule. A limit that does not bind
    /// is a problem naming its key; the values returned are those of the limits that bind.
    /// </summary>
    public static IReadOnlyList<KeyValuePair<string, string?>> Read(IConfiguration configuration, List<ConfigurationProblem> problems)
    {
        var accepted = new List<KeyValuePair<string, string?>>();
        // One limit at a time, so that every bad one is reported; a limit with parts
        // (MinRequestBodyDataRate's BytesPerSecond and GracePeriod, Http2's) is bound whole.
        foreach (var limit in configuration.GetSection(Section).GetChildren())
        {
            var values = limit.AsEnumerable().Where(pair => pair.Value is not null).ToList();
            var problem = Problem(limit.Path, values);
            if (problem is null)
            {
                accepted.AddRange(values);
            }
            else
            {
                problems.Add(problem);
            }
        }

        return accepted;
    }

    /// <summary>Sets checked values (from <see cref="Read"/>) on Kestrel's limits.</summary>
    public static void Apply(IReadOnlyList<KeyValuePair<string, string?>> values, KestrelServerLimits limits)
    {
        if (values.Count == 0)
        {
            return;
        }

        // A data rate has no setters, only a constructor: the binder builds a new one (and checks
        // that both parts are given) only where the limit is null, and would otherwise ignore it.
        if (Given(values, nameof(KestrelServerLimits.MinRequestBodyDataRate)))
        {
            limits.MinRequestBodyDataRate = null;
        }

        if (Given(values, nameof(KestrelServerLimits.MinResponseDataRate)))
        {
            limits.MinResponseDataRate = null;
        }

        new ConfigurationBuilder().AddInMemoryCollection(values).Build().GetSection(Section)
            .Bind(limits, binder => binder.ErrorOnUnknownConfiguration = true);
    }

    private static bool Given(IReadOnlyList<KeyValuePair<string, string?>> values, string limit) =>
        values.Any(v => v.Key.StartsWith($"{Section}:{limit}:", StringComparison.OrdinalIgnoreCase));

    /// <summary>Keys under Kestrel that Tern does not read (all but Kestrel:Limits), to be logged as ignored.</summary>
    public static IEnumerable<string> IgnoredKeys(IConfiguration configuration) =>
        configuration.GetSection("Kestrel").AsEnumerable()
            .Where(pair => pair.Value is not null && !pair.Key.StartsWith(Section + ":", StringComparison.OrdinalIgnoreCase))
            .Select(pair => pair.Key);

    private static ConfigurationProblem? Problem(string key, List<KeyValuePair<string, string?>> values)
    {
        try
        {
            Apply(values, new KestrelServerLimits());
            return null;
        }
        catch (InvalidOperationException ex) when (ex.Message.Contains("were not found", StringComparison.Ordinal))
        {
            // "... the following properties were not found on the instance of Http2Limits: 'Bogus'".
            var unknown = values.FirstOrDefault(v => ex.Message.EndsWith($"'{v.Key[(v.Key.LastIndexOf(':') + 1)..]}'", StringComparison.OrdinalIgnoreCase)).Key;
            return new(unknown ?? key, "is not one of Kestrel's limits (misspelt?); README \"Listener limits\" lists them");
        }
        catch (InvalidOperationException ex) when (ex.Message.StartsWith("Cannot create instance", StringComparison.Ordinal))
        {
            return new(key, "needs both BytesPerSecond and GracePeriod (e.g. 240 and 00:00:05)");
        }
        catch (InvalidOperationException ex) when (ex.InnerException is FormatException or ArgumentException or OverflowException or NotSupportedException)
        {
            // "Failed to convert configuration value '...' at 'Kestrel:Limits:X' to type 'System.Nullable`1[System.Int64]'".
            var (at, value) = values.FirstOrDefault(v => ex.Message.Contains($"'{v.Key}'", StringComparison.OrdinalIgnoreCase));
            var expected = ex.Message.Contains("TimeSpan", StringComparison.Ordinal) ? "a duration (hh:mm:ss, e.g. 00:02:10)"
                : ex.Message.Contains("Boolean", StringComparison.Ordinal) ? "true or false"
                : ex.Message.Contains("System.Int", StringComparison.Ordinal) || ex.Message.Contains("System.Double", StringComparison.Ordinal) ? "a number"
                : "a value of the limit's type";
            return new(at ?? key, $"'{value}' is not {expected}");
        }
        catch (TargetInvocationException ex) when (ex.InnerException is ArgumentException argument)
        {
            // Kestrel's own range check, in the limit's setter or a data rate's constructor.
            var value = values.Count == 1 ? $"'{values[0].Value}' " : "";
            return new(values.Count == 1 ? values[0].Key : key, $"{value}is out of range: {argument.Message.Replace($" (Parameter '{argument.ParamName}')", "", StringComparison.Ordinal)}");
        }
        catch (InvalidOperationException ex)
        {
            return new(key, ex.Message);
        }
    }
}

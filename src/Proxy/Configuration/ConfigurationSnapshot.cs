using System.Globalization;
using System.Reflection;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Logging.Console;
using Microsoft.Extensions.Options;
using Tern.Proxy.Tls;

namespace Tern.Proxy.Configuration;

/// <summary>
/// One fully checked configuration: Tern's settings, the loaded certificates and the
/// ReverseProxy section to hand to YARP. Built at start and on every reload; never partial.
/// </summary>
public sealed record ConfigurationSnapshot(
    TernSettings Settings,
    CertificateSet Certificates,
    bool SelfSigned,
    IReadOnlyList<KeyValuePair<string, string?>> ReverseProxy,
    IReadOnlyList<UnreadSetting> Unread)
{
    /// <summary>Session ticket keys from Tern:Tls:SessionTicketKeys (empty: per-process random keys).</summary>
    public ReadOnlyMemory<byte> SessionTicketKeys { get; init; }

    /// <summary>The Logging section (levels, console options), handed to .NET's logging through a <see cref="ConfigurationGate"/>.</summary>
    public IReadOnlyList<KeyValuePair<string, string?>> Logging { get; init; } = [];

    /// <summary>The client certificates (mTLS) the HTTPS listener accepts.</summary>
    public ClientCertificateTrust ClientCertificates { get; init; } = ClientCertificateTrust.None;

    /// <summary>Size of one session ticket key: 16 bytes name, 32 AES-256 key, 32 HMAC-SHA256 key.</summary>
    public const int SessionTicketKeySize = 80;

    /// <summary>Reads and checks everything; on failure returns null and every problem found.</summary>
    internal static ConfigurationSnapshot? TryLoad(IConfiguration configuration, out IReadOnlyList<ConfigurationProblem> problems) =>
        TryLoad(configuration, out problems, out _);

    /// <summary>Reads and checks everything, as above.</summary>
    /// <param name="configuration">The whole configuration.</param>
    /// <param name="problems">Every problem found; empty when it returns a snapshot.</param>
    /// <param name="unread">The keys Tern ignores (the snapshot's <see cref="Unread"/>), given also when it returns null: a misspelt key is often why a value is missing.</param>
    internal static ConfigurationSnapshot? TryLoad(IConfiguration configuration, out IReadOnlyList<ConfigurationProblem> problems, out IReadOnlyList<UnreadSetting> unread)
    {
        var reader = new SettingReader(configuration);
        reader.Problems.AddRange(CheckedJsonFile.Problems(configuration));
        reader.Problems.AddRange(LayeredSources.Problems(configuration));
        var settings = TernSettings.Read(reader) with { ListenerLimits = Listeners.ListenerLimits.Read(configuration, reader.Problems) };
        var reverseProxy = Values(configuration, ReverseProxyValidator.Section);
        ReverseProxyValidator.Validate(configuration, reverseProxy, reader.Problems);
        CheckLogLevels(configuration, reader.Problems);
        CheckConsoleOptions(configuration, reader.Problems);

        var selfSigned = settings.Certificates.Count == 0;
        var certificates = LoadCertificates(settings, selfSigned, reader.Problems);
        var ticketKeys = LoadTicketKeys(settings.SessionTicketKeysPath, reader.Problems);
        var clientCertificates = ClientCertificateTrust.Load(settings, reader.Problems);

        // What YARP drops from a route's Match widens the route: a problem, not a warning.
        var yarp = YarpKeys.Unread(reverseProxy).ToLookup(u => YarpKeys.InMatch(u.Key));
        reader.Problems.AddRange(yarp[true].Select(u => new ConfigurationProblem(u.Key, u.Reason)));

        problems = reader.Problems;
        unread = reader.UnreadKeys(TernSettings.Section).Concat(Listeners.ListenerLimits.IgnoredKeys(configuration))
            .Select(key => UnreadSetting.Unknown(key, IsSection(configuration, key)) with { Value = configuration[key] })
            .Concat(yarp[false])
            .ToList();
        if (problems.Count > 0 || certificates is null)
        {
            return null;
        }

        return new ConfigurationSnapshot(settings, certificates, selfSigned, reverseProxy, unread)
        {
            Logging = Values(configuration, LoggingSection),
            SessionTicketKeys = ticketKeys,
            ClientCertificates = clientCertificates,
        };
    }

    public const string LoggingSection = "Logging";

    /// <summary>
    /// Whether a key Tern does not read is a section given a value (Tern__Https=5 beside
    /// Tern:Https:Port, or Kestrel__Limits=5): .NET keeps both, and readers ask only for the parts.
    /// </summary>
    private static bool IsSection(IConfiguration configuration, string key) =>
        !key.Contains(':', StringComparison.Ordinal)
        || key.Equals(Listeners.ListenerLimits.Section, StringComparison.OrdinalIgnoreCase)
        || configuration.GetSection(key).GetChildren().Any();

    private static List<KeyValuePair<string, string?>> Values(IConfiguration configuration, string section) =>
        configuration.GetSection(section).AsEnumerable().Where(pair => pair.Value is not null).ToList();

    /// <summary>
    /// Every value under Logging:LogLevel and Logging:{provider}:LogLevel, at any depth
    /// (Logging__LogLevel__Microsoft__AspNetCore is Logging:LogLevel:Microsoft:AspNetCore), parsed
    /// as .NET's logger filter parses them: a value it cannot parse throws inside the logging
    /// system, at start (where it used to be reported as a ReverseProxy problem) and on every reload.
    /// </summary>
    private static void CheckLogLevels(IConfiguration configuration, List<ConfigurationProblem> problems)
    {
        var logging = configuration.GetSection(LoggingSection);
        var levels = logging.GetChildren().Select(c => c.Key.Equals("LogLevel", StringComparison.OrdinalIgnoreCase) ? c : c.GetSection("LogLevel"));
        foreach (var section in levels)
        {
            foreach (var (key, value) in section.AsEnumerable())
            {
                if (string.IsNullOrEmpty(value))
                {
                    continue;
                }

                if (key == section.Path)
                {
                    // Logging__LogLevel=Warning: .NET reads categories under it and would ignore this.
                    problems.Add(new(key, $"'{value}' is given to the section itself, which .NET ignores; name a category: {key}:Default={value}"));
                }
                else if (!Enum.TryParse<LogLevel>(value, ignoreCase: true, out _))
                {
                    problems.Add(new(key, $"'{value}' is not a log level; use Trace, Debug, Information, Warning, Error, Critical or None"));
                }
            }
        }
    }

    /// <summary>The console log formats .NET's console logger has (AddConsole registers these three).</summary>
    private static readonly string[] ConsoleFormats = ["simple", "json", "systemd"];

    /// <summary>The sections .NET's console logger reads its options from, under Logging.</summary>
    private static readonly string[] ConsoleSections = ["Console", "Microsoft.Extensions.Logging.Console.ConsoleLoggerProvider"];

    /// <summary>
    /// The console logger's options (Logging:Console, and FormatterOptions under it, which every
    /// format reads), value by value, as .NET reads them: a value it cannot convert or refuses
    /// (QueueFullMode=Drop, MaxQueueLength=0) throws inside the logging system, which at start was
    /// reported as a ReverseProxy problem or ended the process with a stack trace, and a
    /// timestamp format .NET cannot format with threw at the first line written. An unknown
    /// format name would be replaced by simple without a word. Empty values .NET leaves alone.
    /// </summary>
    private static void CheckConsoleOptions(IConfiguration configuration, List<ConfigurationProblem> problems)
    {
        foreach (var console in ConsoleSections.Select(configuration.GetSection(LoggingSection).GetSection))
        {
            foreach (var (key, value) in console.AsEnumerable(makePathsRelative: true))
            {
                if (string.IsNullOrEmpty(value) || key.Equals("LogLevel", StringComparison.OrdinalIgnoreCase) || key.StartsWith("LogLevel:", StringComparison.OrdinalIgnoreCase))
                {
                    continue;
                }

                var problem = ConsoleOptionProblem(console.Key, key, value);
                if (problem is null && key.Equals(nameof(ConsoleLoggerOptions.FormatterName), StringComparison.OrdinalIgnoreCase)
                    && !ConsoleFormats.Contains(value, StringComparer.OrdinalIgnoreCase))
                {
                    problem = "is not a console log format; use simple, json or systemd";
                }

                if (problem is null && key.EndsWith(nameof(ConsoleFormatterOptions.TimestampFormat), StringComparison.OrdinalIgnoreCase))
                {
                    try
                    {
                        _ = DateTimeOffset.UnixEpoch.ToString(value, CultureInfo.CurrentCulture); // as the formatters write it
                    }
                    catch (FormatException)
                    {
                        problem = "is not a .NET date and time format (e.g. yyyy-MM-ddTHH:mm:ss.fffZ)";
                    }
                }

                if (problem is not null)
                {
                    problems.Add(new($"{console.Path}:{key}", $"'{value}' {problem}"));
                }
            }
        }
    }

    /// <summary>
    /// Why .NET's console logger cannot take value at key (under the section named section), or
    /// null: a logging system of its own with that one value, asked for the logger's and each
    /// format's options, as Tern's is when the value arrives.
    /// </summary>
    private static string? ConsoleOptionProblem(string section, string key, string value)
    {
        var services = new ServiceCollection();
        services.AddLogging(logging => logging
            .AddConfiguration(new ConfigurationBuilder().AddInMemoryCollection([new($"{section}:{key}", value)]).Build())
            .AddConsole());
        using var provider = services.BuildServiceProvider();
        try
        {
            _ = provider.GetRequiredService<IOptionsMonitor<ConsoleLoggerOptions>>().CurrentValue;
            _ = provider.GetRequiredService<IOptionsMonitor<SimpleConsoleFormatterOptions>>().CurrentValue;
            _ = provider.GetRequiredService<IOptionsMonitor<JsonConsoleFormatterOptions>>().CurrentValue;
            _ = provider.GetRequiredService<IOptionsMonitor<ConsoleFormatterOptions>>().CurrentValue;
            return null;
        }
        catch (Exception ex) when (ex is ArgumentException or FormatException or OverflowException or InvalidOperationException or TargetInvocationException)
        {
            var cause = ex is TargetInvocationException { InnerException: { } inner } ? inner : ex;
            if (cause is ArgumentOutOfRangeException)
            {
                return $"is out of range ({cause.Message})"; // converted, and refused by the option itself
            }

            // Not convertible to the option's type: say what it takes.
            const string Formatter = "FormatterOptions:";
            var target = key.StartsWith(Formatter, StringComparison.OrdinalIgnoreCase)
                ? OptionType(typeof(SimpleConsoleFormatterOptions), key[Formatter.Length..]) ?? OptionType(typeof(JsonConsoleFormatterOptions), key[Formatter.Length..])
                : OptionType(typeof(ConsoleLoggerOptions), key);
            return target switch
            {
                not null when target == typeof(bool) => "is not true or false",
                not null when target == typeof(int) => "is not a whole number",
                { IsEnum: true } => $"is not one of {string.Join(", ", Enum.GetNames(target))}",
                _ => $"cannot be read ({cause.Message})",
            };
        }
    }

    /// <summary>The type of the option at path (a:b, any case) under root, nullable types unwrapped; null where there is none.</summary>
    private static Type? OptionType(Type root, string path)
    {
        var type = path.Split(':').Aggregate((Type?)root, (t, name) => t?.GetProperty(name, BindingFlags.Public | BindingFlags.Instance | BindingFlags.IgnoreCase)?.PropertyType);
        return type is null ? null : Nullable.GetUnderlyingType(type) ?? type;
    }

    private static byte[] LoadTicketKeys(string? path, List<ConfigurationProblem> problems)
    {
        const string key = "Tern:Tls:SessionTicketKeys";
        if (path is null)
        {
            return [];
        }

        try
        {
            var keys = TernFile.ReadAllBytes(path);
            if (keys.Length == 0 || keys.Length % SessionTicketKeySize != 0)
            {
                problems.Add(new(key, $"'{path}' holds {keys.Length} bytes; it must hold one or more {SessionTicketKeySize}-byte keys (e.g. `openssl rand 80 > ticket.key`), the first one encrypting new tickets"));
                return [];
            }

            return keys;
        }
        catch (Exception ex) when (ex is IOException or UnauthorizedAccessException)
        {
            problems.Add(new(key, $"cannot read '{path}': {ex.Message}"));
            return [];
        }
    }

    private static CertificateSet? LoadCertificates(TernSettings settings, bool selfSigned, List<ConfigurationProblem> problems)
    {
        if (!selfSigned)
        {
            return CertificateSet.Load(settings.Certificates, problems);
        }

        try
        {
            return CertificateSet.Load([SelfSignedCertificate.Ensure(settings.SelfSignedDirectory)], problems);
        }
        catch (Exception ex) when (ex is IOException or UnauthorizedAccessException or ArgumentException)
        {
            problems.Add(new("Tern:Tls:SelfSignedDirectory",
                $"no certificate is configured and the self-signed one cannot be written to '{settings.SelfSignedDirectory}': {ex.Message}; configure Tern:Tls:Certificates or point this at a writable folder"));
            return null;
        }
    }
}

using System.Collections;
using System.Reflection;
using Microsoft.Extensions.Configuration;
using Tern.Proxy.Configuration;
using Tern.Tests.Infrastructure;
using Yarp.ReverseProxy.Configuration;

namespace Tern.Tests.Configuration;

/// <summary>
/// Route and cluster values YARP takes but cannot serve (every request a 500, or sent somewhere
/// else without a word) are problems of their key; keys YARP does not read are named as ignored.
/// Checked through ConfigurationSnapshot.TryLoad, as at start and on every reload.
/// </summary>
public sealed class ReverseProxyChecksTests
{
    private const string Route = "ReverseProxy:Routes:r";
    private const string Cluster = "ReverseProxy:Clusters:c";

    private static Dictionary<string, string?> Base() => new(StringComparer.OrdinalIgnoreCase)
    {
        ["Tern:Tls:Certificates:a:CertificatePath"] = TestPki.ATest.CertificatePath,
        ["Tern:Tls:Certificates:a:KeyPath"] = TestPki.ATest.KeyPath,
        [$"{Route}:ClusterId"] = "c",
        [$"{Route}:Match:Path"] = "/api/{**rest}",
        [$"{Cluster}:Destinations:d1:Address"] = "http://127.0.0.1:1/",
    };

    private static ConfigurationSnapshot? Load(Dictionary<string, string?> values, out IReadOnlyList<ConfigurationProblem> problems) =>
        ConfigurationSnapshot.TryLoad(new ConfigurationBuilder().AddInMemoryCollection(values).Build(), out problems);

    [Theory]
    // Hosts as ASP.NET Core's host matching reads them: what it cannot read was a 500 for every request.
    [InlineData("Routes:r:Match:Hosts:0", "[::1]:8443", "'[::1]:8443': ASP.NET Core's host matching cannot match an IPv6 address")]
    [InlineData("Routes:r:Match:Hosts:0", "::1", "'::1': ASP.NET Core's host matching cannot match an IPv6 address")]
    [InlineData("Routes:r:Match:Hosts:0", "example.com:", "'example.com:': '' is not a port: give 1-65535 or *, or no port")]
    [InlineData("Routes:r:Match:Hosts:0", "example.com:https", "'example.com:https': 'https' is not a port")]
    [InlineData("Routes:r:Match:Hosts:0", ":8443", "':8443': names no host")]
    [InlineData("Routes:r:Match:Hosts:0", "example.com:70000", "'example.com:70000': '70000' is not a port")] // never matched
    [InlineData("Routes:r:Match:Hosts:0", "example.com", null)]
    [InlineData("Routes:r:Match:Hosts:0", "*.example.com:8443", null)]
    [InlineData("Routes:r:Match:Hosts:0", "example.com:*", null)]
    [InlineData("Routes:r:Match:Hosts:0", "*", null)]
    // A path written as nginx or Envoy take a prefix, or as a regular expression, matched that text alone.
    [InlineData("Routes:r:Match:Path", "/api/*", "'/api/*' is written as a wildcard, but a route template takes neither: it matches only the path '/api/*' itself; for every path under /api write /api/{**rest}")]
    [InlineData("Routes:r:Match:Path", "/*", "'/*' is written as a wildcard, but a route template takes neither: it matches only the path '/*' itself; for every path under / write /{**rest}")]
    [InlineData("Routes:r:Match:Path", "/api/.*", "'/api/.*' is written as a regular expression, but a route template takes neither")]
    [InlineData("Routes:r:Match:Path", "^/api", "'^/api' is written as a regular expression, but a route template takes neither: it matches only the path '^/api' itself; for every path under /api write /api/{**rest}")]
    [InlineData("Routes:r:Match:Path", "/odata/$metadata", null)] // OData's paths are literal
    [InlineData("Routes:r:Match:Path", "/api/{*rest}", null)]
    // A PathPattern YARP cannot fill sent the route's requests to '/'.
    [InlineData("Routes:r:Transforms:0:PathPattern", "/v2/{**remainder}", "'/v2/{**remainder}' uses {remainder}, which ReverseProxy:Routes:r:Match:Path does not capture (it captures {rest}); YARP would send such requests to /")]
    [InlineData("Routes:r:Transforms:0:pathpattern", "/v2/{**REST}", null)] // any case, as ASP.NET Core's routing
    [InlineData("Routes:r:Transforms:0:PathPattern", "/v2/{**rest", null)] // YARP refuses what it cannot parse itself
    // An address YARP joins the request's path to as text.
    [InlineData("Clusters:c:Destinations:d1:Address", "http://127.0.0.1:1/?x=1", "'http://127.0.0.1:1/?x=1' has a query (?x=1), which would be put before each request's path")]
    [InlineData("Clusters:c:Destinations:d1:Address", "http://127.0.0.1:1/base#f", "'http://127.0.0.1:1/base#f' has a fragment (#f)")]
    [InlineData("Clusters:c:Destinations:d1:Address", "http://app:s3cret@127.0.0.1:1/", "'http://127.0.0.1:1/' has a user and password (user@), which are never sent")]
    [InlineData("Clusters:c:Destinations:d1:Address", "https://app.internal:8443/base/", null)]
    [InlineData("Clusters:c:Destinations:d1:Health", "not a url", "'not a url' is not an absolute http:// or https:// URL")]
    [InlineData("Clusters:c:Destinations:d1:Health", "http://127.0.0.1:2/?probe=1", "'http://127.0.0.1:2/?probe=1' has a query (?probe=1)")]
    [InlineData("Clusters:c:Destinations:d1:Health", "http://127.0.0.1:2/", null)]
    [InlineData("Clusters:c:Destinations:d1:Health", "", null)]
    // A probe path YARP's PathString throws on at every probe.
    [InlineData("Clusters:c:HealthCheck:Active:Path", "healthz", "'healthz' does not start with /")]
    [InlineData("Clusters:c:HealthCheck:Active:Path", "/healthz", null)]
    public void Value_AProblemOfItsKey_OnlyWhereYarpCannotServeIt(string key, string value, string? problem)
    {
        var values = Base();
        values[$"ReverseProxy:{key}"] = value;

        Load(values, out var problems);

        if (problem is null)
        {
            Assert.Empty(problems);
        }
        else
        {
            var found = Assert.Single(problems);
            Assert.Equal($"ReverseProxy:{key}", found.Key, ignoreCase: true);
            Assert.StartsWith(problem, found.Message, StringComparison.Ordinal);
            Assert.DoesNotContain("s3cret", found.Message, StringComparison.Ordinal);
        }
    }

    [Theory]
    [InlineData("ReverseProxy:Clusters:c:HttpRequest:ActivityTimout", "00:00:05", "ReverseProxy:Clusters:c:HttpRequest:ActivityTimout", false, "ActivityTimeout")]
    [InlineData("ReverseProxy:Routes:r:Match:Pth", "/x", "ReverseProxy:Routes:r:Match:Pth", false, "Path")]
    [InlineData("ReverseProxy:Routes:r:Match:Host:0", "example.com", "ReverseProxy:Routes:r:Match:Host", false, "Hosts")] // the route would match every host
    [InlineData("ReverseProxy:Routes:r:Path", "/x", "ReverseProxy:Routes:r:Path", false, "Match:Path")]
    [InlineData("ReverseProxy:Clusters:c:Address", "http://x/", "ReverseProxy:Clusters:c:Address", false, "Destinations:<name>:Address")]
    [InlineData("ReverseProxy:Clusters:c:Destinatons:d2:Address", "http://x/", "ReverseProxy:Clusters:c:Destinatons", false, "Destinations")] // named once, where it goes wrong
    [InlineData("ReverseProxy:Clusters:c:HealthCheck:Active:Query", "a=1", "ReverseProxy:Clusters:c:HealthCheck:Active:Query", false, null)] // a later YARP's
    [InlineData("ReverseProxy:Routes:r:Transforms:0:RequestHeader:x", "1", "ReverseProxy:Routes:r:Transforms:0:RequestHeader:x", false, null)]
    [InlineData("ReverseProxy:Routes", "5", "ReverseProxy:Routes", true, null)]
    [InlineData("ReverseProxy", "5", "ReverseProxy", true, null)]
    [InlineData("Tern:Https", "5", "Tern:Https", true, null)]
    [InlineData("Tern", "5", "Tern", true, null)]
    [InlineData("Kestrel:Limits", "5", "Kestrel:Limits", true, null)]
    [InlineData("Kestrel", "5", "Kestrel", true, null)]
    [InlineData("Kestrel:AddServerHeader", "true", "Kestrel:AddServerHeader", false, null)]
    [InlineData("Tern:Htps:Port", "1", "Tern:Htps:Port", false, null)]
    public void KeyNothingReads_IsNamedAsIgnored_WithTheNameMeant(string key, string value, string named, bool section, string? hint)
    {
        var values = Base();
        values["Tern:Https:Port"] = "8443";
        values["Kestrel:Limits:MaxRequestBodySize"] = "1000";
        values[key] = value;

        var snapshot = Load(values, out var problems);

        Assert.Empty(problems);
        var unread = Assert.Single(snapshot!.Unread);
        Assert.Equal(new UnreadSetting(named, section, hint), unread);
    }

    [Theory]
    [InlineData("ReverseProxy:Routes:r:Transforms", "")] // JSON's [] and {} arrive as empty values
    [InlineData("ReverseProxy:Clusters:c:Metadata", "")]
    [InlineData("ReverseProxy:Routes:r:Metadata:Owner.Team", "web")] // metadata names are free
    public void EmptySectionsAndFreeNames_AreNotIgnoredKeys(string key, string value)
    {
        var values = Base();
        values[key] = value;

        var snapshot = Load(values, out var problems);

        Assert.Empty(problems);
        Assert.Empty(snapshot!.Unread);
    }

    /// <summary>
    /// Every property of YARP's route and cluster types, as its configuration reader reads it, is
    /// a key Tern knows: a YARP upgrade that reads a new key fails here until YarpKeys has it.
    /// </summary>
    [Fact]
    public void EveryKeyYarpsConfigTypesHave_IsRead()
    {
        var values = Base();
        foreach (var key in Keys($"{Route}", typeof(RouteConfig)).Concat(Keys(Cluster, typeof(ClusterConfig))))
        {
            values.TryAdd(key, "x");
        }

        Assert.True(values.Count > 60, $"only {values.Count} keys generated");
        var unread = Yarp(values);
        Assert.Empty(unread);
    }

    private static List<UnreadSetting> Yarp(Dictionary<string, string?> values) =>
        [.. YarpKeys.Unread(values.Where(v => v.Key.StartsWith("ReverseProxy", StringComparison.OrdinalIgnoreCase)))];

    /// <summary>The keys YARP's reader reads for a config type: ids are the section names, lists and dictionaries take any child name.</summary>
    private static IEnumerable<string> Keys(string prefix, Type type)
    {
        foreach (var property in type.GetProperties(BindingFlags.Public | BindingFlags.Instance).Where(p => p.CanWrite || p.SetMethod is not null))
        {
            if (property.Name is "RouteId" or "ClusterId")
            {
                continue;
            }

            var key = $"{prefix}:{property.Name}";
            var propertyType = Nullable.GetUnderlyingType(property.PropertyType) ?? property.PropertyType;
            foreach (var child in Keys(key, propertyType, property.Name))
            {
                yield return child;
            }
        }
    }

    private static IEnumerable<string> Keys(string key, Type type, string name)
    {
        if (name == "SslProtocols")
        {
            return [$"{key}:0"]; // a flags enum, read as a list of names
        }

        if (type == typeof(string) || type.IsPrimitive || type.IsEnum || type == typeof(TimeSpan) || type == typeof(Version) || type == typeof(Uri) || type == typeof(System.Text.Encoding))
        {
            return [key];
        }

        if (type.IsGenericType && type.GetGenericArguments() is [var keyType, var valueType] && typeof(IEnumerable).IsAssignableFrom(type) && keyType == typeof(string))
        {
            return Keys($"{key}:anyname", Nullable.GetUnderlyingType(valueType) ?? valueType, name); // a dictionary
        }

        if (type.IsArray || (type.IsGenericType && typeof(IEnumerable).IsAssignableFrom(type)))
        {
            var element = type.IsArray ? type.GetElementType()! : type.GetGenericArguments()[0];
            return Keys($"{key}:0", element, name);
        }

        return Keys(key, type);
    }
}

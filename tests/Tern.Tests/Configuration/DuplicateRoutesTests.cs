using System.Net;
using Microsoft.AspNetCore.Hosting.Server;
using Microsoft.AspNetCore.Hosting.Server.Features;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.Logging;
using Tern.Proxy.Configuration;

namespace Tern.Tests.Configuration;

/// <summary>
/// Tern refuses two routes the router could not choose between (<see cref="DuplicateRoutes"/>),
/// and nothing else. Each row is two routes and a request both could match; the router's own
/// verdict is taken from a stock YARP proxy on Kestrel (no Tern check in front) given the same
/// routes: a 500 (the router threw: it could choose neither) or a 502 (one route won, and its
/// cluster's destination refused the connection). Tern must refuse exactly the pairs that 500.
/// </summary>
public sealed class DuplicateRoutesTests
{
    /// <summary>Route a's Match, route b's Match (keys under Routes:x:, joined by |), the request (host path [method]), whether the router collides.</summary>
    public static TheoryData<string, string, string, string, bool> Pairs() => new()
    {
        { "catch-alls named apart", "Match:Path={**a}", "Match:Path=/{**b}", "a.test /x", true },
        { "case and trailing slash", "Match:Path=/p/{id}", "Match:Path=/P/{x}/", "a.test /p/1", true },
        { "only Hosts is every path", "Match:Hosts:0=a.test", "Match:Path={**all}|Match:Hosts:0=a.test", "a.test /x", true },
        { "hosts in other letter case rank apart", "Match:Path={**a}|Match:Hosts:0=a.test", "Match:Path={**b}|Match:Hosts:0=A.TEST", "a.test /x", false },
        { "a host in common", "Match:Path={**a}|Match:Hosts:0=a.test", "Match:Path={**b}|Match:Hosts:0=b.test|Match:Hosts:1=a.test", "a.test /x", true },
        { "the same wildcard", "Match:Path={**a}|Match:Hosts:0=*.test", "Match:Path={**b}|Match:Hosts:0=*.test", "a.test /x", true },
        { "a method in common", "Match:Path={**a}|Match:Methods:0=GET", "Match:Path={**b}|Match:Methods:0=POST|Match:Methods:1=get", "a.test /x", true },
        { "the same header", "Match:Path={**a}|Match:Headers:0:Name=X-A|Match:Headers:0:Values:0=1", "Match:Path={**b}|Match:Headers:0:Name=X-A|Match:Headers:0:Values:0=1", "a.test /x", true },
        { "Order 0 given and not", "Match:Path={**a}|Order=0", "Match:Path={**b}", "a.test /x", true },
        { "a constraint ranks first", "Match:Path=/c/{id:int}", "Match:Path=/c/{x}", "a.test /c/1", false },
        { "a host ranks before none", "Match:Path={**a}|Match:Hosts:0=a.test", "Match:Path={**b}", "a.test /x", false },
        { "a name ranks before a wildcard", "Match:Path={**a}|Match:Hosts:0=*.test", "Match:Path={**b}|Match:Hosts:0=a.test", "a.test /x", false },
        { "a method ranks before none", "Match:Path={**a}|Match:Methods:0=GET", "Match:Path={**b}", "a.test /x", false },
        { "a lower Order wins", "Match:Path={**a}|Order=1", "Match:Path={**b}", "a.test /x", false },
        { "a default value is no rank", "Match:Path=/d/{x=v}", "Match:Path=/d/{y}", "a.test /d/q", true },
        { "an optional parameter is no rank", "Match:Path=/o/{x?}", "Match:Path=/o/{y}", "a.test /o/q", true },
        { "a literal ranks before a parameter", "Match:Path=/l/x", "Match:Path=/l/{x}", "a.test /l/x", false },
        { "different headers", "Match:Path={**a}|Match:Headers:0:Name=X-A|Match:Headers:0:Values:0=1", "Match:Path={**b}|Match:Headers:0:Name=X-B|Match:Headers:0:Values:0=1", "a.test /x", false },
    };

    [Theory]
    [MemberData(nameof(Pairs))]
    public async Task TernRefusesExactlyThePairsTheRouterCannotChooseBetween(string name, string a, string b, string request, bool collides)
    {
        var values = new Dictionary<string, string?>
        {
            ["ReverseProxy:Clusters:c:Destinations:d:Address"] = "http://127.0.0.1:1/",
            ["ReverseProxy:Routes:a:ClusterId"] = "c",
            ["ReverseProxy:Routes:b:ClusterId"] = "c",
        };
        foreach (var (route, settings) in new[] { ("a", a), ("b", b) })
        {
            foreach (var setting in settings.Split('|'))
            {
                var equals = setting.IndexOf('=', StringComparison.Ordinal);
                values[$"ReverseProxy:Routes:{route}:{setting[..equals]}"] = setting[(equals + 1)..];
            }
        }

        var configuration = new ConfigurationBuilder().AddInMemoryCollection(values).Build();
        var problems = new List<ConfigurationProblem>();
        DuplicateRoutes.Check(configuration.GetSection("ReverseProxy:Routes").GetChildren(), problems);

        var parts = request.Split(' ');
        var status = await StockYarpAnswerAsync(configuration, parts[0], parts[1], parts.Length > 2 ? parts[2] : "GET");

        Assert.True(status is HttpStatusCode.InternalServerError or HttpStatusCode.BadGateway, $"{name}: the router answered {(int)status}");
        Assert.Equal(collides, status == HttpStatusCode.InternalServerError);
        if (collides)
        {
            var problem = Assert.Single(problems);
            Assert.Equal("ReverseProxy:Routes:b:Match", problem.Key);
            Assert.StartsWith("matches the same requests as route 'a'", problem.Message, StringComparison.Ordinal);
        }
        else
        {
            Assert.Empty(problems);
        }
    }

    /// <summary>The status a stock YARP proxy on Kestrel answers, with the header X-A: 1.</summary>
    private static async Task<HttpStatusCode> StockYarpAnswerAsync(IConfiguration configuration, string host, string path, string method)
    {
        var builder = WebApplication.CreateSlimBuilder();
        builder.Logging.ClearProviders();
        builder.WebHost.UseUrls("http://127.0.0.1:0");
        builder.Services.AddReverseProxy().LoadFromConfig(configuration.GetSection("ReverseProxy"));
        await using var app = builder.Build();
        app.MapReverseProxy();
        await app.StartAsync();
        var address = app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses.Single();

        using var client = new HttpClient();
        using var message = new HttpRequestMessage(new HttpMethod(method), address + path);
        message.Headers.Host = host;
        message.Headers.Add("X-A", "1");
        using var response = await client.SendAsync(message);
        await app.StopAsync();
        return response.StatusCode;
    }
}

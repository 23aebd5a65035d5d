import cProfile, pstats, time, io, os
from core.models import AgentRequest
from tests.integration.test_dispatch_and_supervise import submit, schedule, record, answer
from tests.servicebus_helpers import receive
from tests.factories import servicebus_message
from scheduler.blueprint import complete_step
from adapters.wiring import services

fn = complete_step.build().get_user_function()

def test_prof(app_settings, servicebus_emulator):
    N = 150
    cs = servicebus_emulator.connection_string
    for i in range(N):
        schedule(submit(f"p-{i}"))
    out = []
    for q in ("INVENTORY_REQUESTS_QUEUE", "PAYMENTS_REQUESTS_QUEUE"):
        msgs = receive(cs, app_settings[q], N, timeout=20)
        reqs = [AgentRequest.model_validate_json(str(m)) for m in msgs]
        bodies = [answer(r, result={"confirmation": "c"}).model_dump_json().encode() for r in reqs]
        t0 = time.thread_time()
        if q.startswith("INV"):
            for r in reqs:
                record(answer(r, result={"confirmation": "c"}))
            out.append(("record", (time.thread_time() - t0) / N * 1000))
        else:
            pr = cProfile.Profile(time.thread_time)
            for b in bodies:
                m = servicebus_message(b, message_id="x")
                fn(m)
            out.append(("complete_step", (time.thread_time() - t0) / N * 1000))
    msgs = receive(cs, app_settings["SHIPPING_REQUESTS_QUEUE"], N, timeout=20)
    reqs = [AgentRequest.model_validate_json(str(m)) for m in msgs]
    bodies = [answer(r, result={"confirmation": "c"}).model_dump_json().encode() for r in reqs]
    pr = cProfile.Profile(time.thread_time)
    pr.enable()
    for b in bodies:
        fn(servicebus_message(b, message_id="x"))
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(80)
    open("/tmp/exp/prof_cs.txt", "w").write(repr(out) + "\n" + s.getvalue())
